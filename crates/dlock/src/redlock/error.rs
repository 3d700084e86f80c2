//! Redlock's errors: a node's failure named by its node, and a round without a quorum.

use super::BACKEND;
use crate::error::Error;

pub(super) fn unavailable(reason: &str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: reason.to_owned().into(),
    }
}

/// `error` from the node `node` (`node 2 (redis://h2:6379)`), as Redlock's own: the backend
/// named `redlock`, the node named in the message, the variant kept.
pub(super) fn on_node(node: &str, error: Error) -> Error {
    let tagged = |source: crate::error::BoxError| -> crate::error::BoxError {
        format!(
            "{node}: {}",
            Error::Backend {
                backend: BACKEND,
                source
            }
            .cause_text()
        )
        .into()
    };
    match error {
        Error::Unavailable { source, .. } => Error::Unavailable {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::Unauthenticated { source, .. } => Error::Unauthenticated {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::PermissionDenied { source, .. } => Error::PermissionDenied {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::Backend { source, .. } => Error::Backend {
            backend: BACKEND,
            source: tagged(source),
        },
        Error::WrongType { key, detail, .. } => Error::WrongType {
            backend: BACKEND,
            key: format!("{key} on {node}"),
            detail,
        },
        other => other,
    }
}

/// The error of a round that too many nodes failed: every node's error, each naming its node.
pub(super) fn no_quorum(what: String, errors: &[Error]) -> Error {
    let each: Vec<String> = errors.iter().map(Error::cause_text).collect();
    unavailable(&format!("{what}; {}", each.join("; ")))
}

/// No quorum because only `answered` of the `nodes` answered, `quorum` being needed.
pub(super) fn too_few_answered(
    answered: usize,
    nodes: usize,
    quorum: usize,
    errors: &[Error],
) -> Error {
    no_quorum(
        format!("only {answered} of {nodes} nodes answered, {quorum} needed"),
        errors,
    )
}
