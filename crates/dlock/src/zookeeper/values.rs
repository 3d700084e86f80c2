//! Versioned values: one persistent node per name, `<chroot>/%00values/<encoded name>`, beside
//! the lock directories (no lock name contains NUL, so no lock directory is called `%00values`).
//! The version is the node's data version + 1; conditional writes are ZooKeeper's own
//! versioned `setData` and exclusive `create`.

use async_trait::async_trait;
use zookeeper_client::{CreateMode, Error as ZkError, MultiWriteError, Stat};

use crate::backend::{Expect, ValueStore, Versioned};
use crate::error::{Error, Result};
use crate::name::LockName;

use super::error::{BACKEND, map};
use super::{Inner, Session, ZookeeperBackend, acls_of, encode_name};

/// The directory of every value, under the chroot.
pub(super) const VALUES_DIR: &str = "%00values";

fn version(stat: &Stat) -> u64 {
    u64::try_from(stat.version).unwrap_or(0) + 1
}

/// The node of value `name` under `chroot`.
fn value_path_in(chroot: &str, name: &str) -> String {
    format!("{chroot}/{VALUES_DIR}/{}", encode_name(name))
}

impl Inner {
    fn value_path(&self, name: &str) -> String {
        value_path_in(&self.config.chroot, name)
    }

    /// Creates the value node; `None` when it already exists. Makes the directory on the way.
    async fn create_value(
        &self,
        session: &Session,
        path: &str,
        value: &[u8],
    ) -> Result<Option<u64>> {
        let options = CreateMode::Persistent.with_acls(self.acls());
        for _ in 0..3 {
            match session.client.create(path, value, &options).await {
                Ok((stat, _)) => return Ok(Some(version(&stat))),
                Err(ZkError::NodeExists) => return Ok(None),
                Err(ZkError::NoNode) => {
                    let dir = format!("{}/{VALUES_DIR}", self.config.chroot);
                    match session.client.mkdir(&dir, &options).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(e) => return Err(map(e, &dir)),
                    }
                }
                Err(e) => return Err(map(e, path)),
            }
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            source: format!("the parent of {path} kept disappearing").into(),
        })
    }
}

#[async_trait]
impl ValueStore for ZookeeperBackend {
    async fn get(&self, name: &LockName) -> Result<Option<Versioned>> {
        let session = self.inner.session().await?;
        session.catch_up().await?;
        let path = self.inner.value_path(name.as_str());
        match session.client.get_data(&path).await {
            Ok((value, stat)) => Ok(Some(Versioned::new(value, version(&stat)))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(map(e, &path)),
        }
    }

    async fn put(&self, name: &LockName, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        let session = self.inner.session().await?;
        let path = self.inner.value_path(name.as_str());
        match expect {
            Expect::Absent => self.inner.create_value(&session, &path, value).await,
            Expect::Version(expected) => {
                let Ok(data_version) = i32::try_from(expected.saturating_sub(1)) else {
                    return Ok(None);
                };
                if expected == 0 {
                    return Ok(None);
                }
                match session
                    .client
                    .set_data(&path, value, Some(data_version))
                    .await
                {
                    Ok(stat) => Ok(Some(version(&stat))),
                    Err(ZkError::BadVersion | ZkError::NoNode) => Ok(None),
                    Err(e) => Err(map(e, &path)),
                }
            }
            Expect::Any => loop {
                match session.client.set_data(&path, value, None).await {
                    Ok(stat) => return Ok(Some(version(&stat))),
                    Err(ZkError::NoNode) => {
                        if let Some(version) =
                            self.inner.create_value(&session, &path, value).await?
                        {
                            return Ok(Some(version));
                        }
                        // Created by someone else in between: overwrite it.
                    }
                    Err(e) => return Err(map(e, &path)),
                }
            },
        }
    }
}

/// A fenced write: one `multi` of a `check` that the hold's node (`held`, its own sequential
/// node) still exists and the value's `setData`, or its `create` when it was never written.
/// `None` when the hold's node is gone (released, its TTL run out, broken, its session
/// ended): nothing written.
pub(super) async fn put_while_held(
    session: &Session,
    held: &str,
    name: &LockName,
    value: &[u8],
) -> Result<Option<u64>> {
    let config = &session.config;
    let path = value_path_in(&config.chroot, name.as_str());
    let acls = acls_of(config);
    let options = CreateMode::Persistent.with_acls(acls);
    for _ in 0..4 {
        let mut multi = session.client.new_multi_writer();
        let add = multi.add_check_version(held, -1);
        let exists = session
            .client
            .check_stat(&path)
            .await
            .map_err(|e| map(e, &path))?;
        let add = add.and_then(|()| match exists {
            Some(_) => multi.add_set_data(&path, value, None),
            None => multi.add_create(&path, value, &options),
        });
        add.map_err(|e| map(e, &path))?;
        match multi.commit().await {
            Ok(results) => {
                if let Some(stat) = results.into_iter().find_map(|result| match result {
                    zookeeper_client::MultiWriteResult::SetData { stat }
                    | zookeeper_client::MultiWriteResult::Create { stat, .. } => Some(stat),
                    _ => None,
                }) {
                    return Ok(Some(version(&stat)));
                }
                return Err(Error::Backend {
                    backend: BACKEND,
                    source: "a fenced write's multi answered without its write".into(),
                });
            }
            Err(MultiWriteError::OperationFailed { index: 0, .. }) => return Ok(None),
            // Created or removed by someone else in between, or the values' directory not
            // made yet: again with what is there now.
            Err(MultiWriteError::OperationFailed {
                source: ZkError::NodeExists | ZkError::NoNode,
                ..
            }) => {
                if exists.is_none() {
                    let dir = format!("{}/{VALUES_DIR}", config.chroot);
                    match session.client.mkdir(&dir, &options).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(e) => return Err(map(e, &dir)),
                    }
                }
            }
            Err(error) => return Err(map(error.into(), &path)),
        }
    }
    Err(Error::Unavailable {
        backend: BACKEND,
        source: format!("{path} kept changing under a fenced write").into(),
    })
}
