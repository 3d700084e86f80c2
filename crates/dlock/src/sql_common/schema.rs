//! The check that an existing table is dlock's, and the names of the tables beside it.

use crate::error::{Error, Result};

/// Column name and `information_schema` data type, in table order.
pub(crate) type Shape = &'static [(&'static str, &'static str)];

/// The waiter queue of lease table `table`.
pub(crate) fn waiters_table(table: &str) -> String {
    format!("{table}_waiters")
}

/// The versioned-value table beside a lock table (both modes have one).
pub(crate) fn values_table(table: &str) -> String {
    format!("{table}_values")
}

/// Checks that every column of `shape` is among the `found` (name, type) pairs with its type;
/// `same` compares names and types by the server's rules (case, for one).
pub(crate) fn check_shape(
    backend: &'static str,
    table: &str,
    found: &[(String, String)],
    shape: Shape,
    same: fn(&str, &str) -> bool,
) -> Result<()> {
    let foreign = |detail: String| Error::WrongType {
        backend,
        key: table.to_owned(),
        detail,
    };
    for (column, data_type) in shape {
        match found.iter().find(|(name, _)| same(name, column)) {
            Some((_, found_type)) if same(found_type, data_type) => {}
            Some((_, found_type)) => {
                return Err(foreign(format!(
                    "column {column} is {found_type}, dlock needs {data_type}"
                )));
            }
            None => {
                return Err(foreign(format!(
                    "no column {column} (found: {}); use ?table= to pick another name",
                    found
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    Ok(())
}
