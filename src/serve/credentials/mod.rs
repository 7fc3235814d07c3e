//! kmirror's own SASL credentials: the SCRAM store (Kafka never hands out stored keys, so a
//! source's users cannot be synced; operators create them here with `kafka-configs.sh`) and the
//! PLAIN users file.
//!
//! | module | job |
//! |---|---|
//! | `scram_store` | SCRAM credentials per user and mechanism, salted as Kafka does, in a 0600 file |
//! | `plain_users` | PLAIN user → password, from an operator's 0600 file |
//! | `apis` | AlterUserScramCredentials, DescribeUserScramCredentials, DescribeClientQuotas |
//! | `secret_file` | atomic 0600 writes and owner-only reads for every file holding a secret |

pub mod apis;
pub mod plain_users;
pub mod scram_store;
pub mod secret_file;

pub use plain_users::PlainUsers;
pub use scram_store::{ScramCredential, ScramStore};
