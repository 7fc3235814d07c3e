//! Why the source or the data plane could not do something, and whether trying again can
//! help. Its own module so the source-side modules (`source_security`, `group_sync`,
//! `source_catalog`) need nothing from the controller.

/// A failure with its reason; `retryable: false` means a wrong password or certificate (trying
/// again cannot help), `timed_out` that the source did not answer within the call's deadline
/// (a black-holed or frozen source; the admin API answers 504 for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub message: String,
    pub retryable: bool,
    pub timed_out: bool,
}

impl Fault {
    pub fn permanent(message: impl Into<String>) -> Fault {
        Fault {
            message: message.into(),
            retryable: false,
            timed_out: false,
        }
    }

    /// The source did not answer within `ms`.
    pub fn timed_out(what: &str, ms: u64) -> Fault {
        Fault {
            message: format!("{what}: source did not answer within {ms} ms"),
            retryable: true,
            timed_out: true,
        }
    }
}

impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault {
            message,
            retryable: true,
            timed_out: false,
        }
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Fault {
        Fault::from(message.to_owned())
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
