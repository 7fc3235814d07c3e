//! The per-partition mirror state machine of KIP-1279 (kip1279.md §2), with no I/O.
//!
//! States are identified by name, never by KIP byte value: the KIP's enum values changed between
//! drafts (LOG_TRUNCATION / PREPARING / LOG_ALIGNMENT), so only names are stable. Every change
//! of state goes through [`PartitionMachine::transition`], which enforces the KIP's table of
//! valid transitions; the command and event handlers only pick a target.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MIRROR_RETRY_BACKOFF_MS_INITIAL, MIRROR_RETRY_BACKOFF_MS_MAX, MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT,
};

/// A mirror partition's state (the subset of KIP-1279's states kmirror implements:
/// EPOCH_FENCING and ULE_RECOVERY belong to a replicated destination and have no role here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StateName {
    LogAlignment,
    Mirroring,
    Pausing,
    Paused,
    Stopping,
    Stopped,
    Failed,
}

impl StateName {
    pub const ALL: [StateName; 7] = [
        StateName::LogAlignment,
        StateName::Mirroring,
        StateName::Pausing,
        StateName::Paused,
        StateName::Stopping,
        StateName::Stopped,
        StateName::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StateName::LogAlignment => "LOG_ALIGNMENT",
            StateName::Mirroring => "MIRRORING",
            StateName::Pausing => "PAUSING",
            StateName::Paused => "PAUSED",
            StateName::Stopping => "STOPPING",
            StateName::Stopped => "STOPPED",
            StateName::Failed => "FAILED",
        }
    }

    pub fn parse(name: &str) -> Option<StateName> {
        StateName::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// KIP-1279's table of valid transitions ([P-new], restricted to kmirror's states). `from` is
/// `None` for a partition that has no state yet.
pub fn is_valid_transition(from: Option<StateName>, to: StateName) -> bool {
    use StateName::*;
    match to {
        LogAlignment => matches!(from, None | Some(Stopped) | Some(Failed)),
        Pausing => from == Some(Mirroring),
        Mirroring => matches!(from, Some(LogAlignment) | Some(Paused) | Some(Failed)),
        Paused => from == Some(Pausing),
        Stopping => matches!(
            from,
            Some(LogAlignment) | Some(Mirroring) | Some(Pausing) | Some(Paused) | Some(Failed)
        ),
        Stopped => from == Some(Stopping),
        Failed => from.is_some(),
    }
}

/// How a FAILED partition retries (KIP `mirror.failed.retry.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Automatic retries before a manual start is needed; 0 disables automatic retry.
    pub max_attempts: u16,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff_ms: MIRROR_RETRY_BACKOFF_MS_INITIAL,
            max_backoff_ms: MIRROR_RETRY_BACKOFF_MS_MAX,
            max_attempts: MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT,
        }
    }
}

impl RetryPolicy {
    /// Wait before retry number `attempt` (1-based): initial, doubling, capped at the maximum.
    pub fn backoff_ms(&self, attempt: u16) -> u64 {
        let doublings = u32::from(attempt.saturating_sub(1)).min(63);
        self.initial_backoff_ms
            .saturating_mul(1u64.checked_shl(doublings).unwrap_or(u64::MAX))
            .min(self.max_backoff_ms)
    }
}

/// Whether a failure may be retried, and how many times it already was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Retry {
    /// The n-th consecutive failure (1-based).
    Attempt(u16),
    /// Retrying cannot help (source topic deleted, source cluster changed...): KIP's -1.
    NonRetryable,
}

impl Retry {
    /// The KIP's `retryAttempt` field: the attempt number, or -1 when non-retryable.
    pub fn as_kip_value(self) -> i32 {
        match self {
            Retry::Attempt(n) => i32::from(n),
            Retry::NonRetryable => -1,
        }
    }
}

/// What FAILED carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub previous: StateName,
    pub retry: Retry,
    pub message: String,
    /// When the failure was recorded (ms since the epoch); the retry is due a backoff later.
    pub failed_at_ms: i64,
}

/// An operator command for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Start,
    Pause,
    Resume,
    Stop,
}

/// Something the data plane or the source sync observed about one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Log alignment is done; the fetcher may run.
    Aligned,
    /// The shard removed the partition's fetcher (completes PAUSING or STOPPING).
    FetcherRemoved,
    /// Data was fetched and stored: the consecutive-failure count starts over.
    Progressed,
    Failed {
        message: String,
        retryable: bool,
        now_ms: i64,
    },
    /// The clock advanced; a FAILED partition whose backoff elapsed retries.
    Tick { now_ms: i64 },
}

/// Why an input was not applied. The partition's state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("cannot {command} a partition in state {state}")]
    NotAllowed {
        command: &'static str,
        state: StateName,
    },
    #[error("cannot {command} a partition that was never started")]
    NotStarted { command: &'static str },
    #[error("partition is FAILED ({message}); {command} is applied only after the retry finishes")]
    FailedPending {
        command: &'static str,
        message: String,
    },
    /// A handler proposed a transition outside the KIP's table: a bug in this module.
    #[error("invalid transition {from:?} -> {to}")]
    InvalidTransition {
        from: Option<StateName>,
        to: StateName,
    },
}

/// What applying an input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The state changed from the first to the second.
    Moved(Option<StateName>, StateName),
    /// The input was already satisfied or carried no change (e.g. pause of a PAUSED partition).
    Unchanged,
}

/// One partition's state plus what FAILED needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMachine {
    state: Option<StateName>,
    failure: Option<Failure>,
    /// Failures since the last progress, carried across retries so the backoff keeps growing
    /// when a retried partition fails again.
    consecutive_failures: u16,
}

impl Default for PartitionMachine {
    fn default() -> Self {
        PartitionMachine::new()
    }
}

impl PartitionMachine {
    /// A partition with no state yet (KIP: "none").
    pub fn new() -> PartitionMachine {
        PartitionMachine {
            state: None,
            failure: None,
            consecutive_failures: 0,
        }
    }

    /// Rebuilds a machine from what `__mirror_state` stored. Rejects combinations no sequence of
    /// valid transitions produces (FAILED without a failure, or a failure outside FAILED).
    pub fn restore(state: StateName, failure: Option<Failure>) -> Option<PartitionMachine> {
        if (state == StateName::Failed) != failure.is_some() {
            return None;
        }
        let consecutive_failures = match &failure {
            Some(Failure {
                retry: Retry::Attempt(n),
                ..
            }) => *n,
            _ => 0,
        };
        Some(PartitionMachine {
            state: Some(state),
            failure,
            consecutive_failures,
        })
    }

    pub fn state(&self) -> Option<StateName> {
        self.state
    }

    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Whether a fetcher should run for this partition.
    pub fn wants_fetcher(&self) -> bool {
        self.state == Some(StateName::Mirroring)
    }

    /// When an automatic retry is due, if one will happen.
    pub fn retry_due_ms(&self, policy: &RetryPolicy) -> Option<i64> {
        let f = self.failure.as_ref()?;
        match f.retry {
            Retry::Attempt(n) if n <= policy.max_attempts => {
                let wait = i64::try_from(policy.backoff_ms(n)).unwrap_or(i64::MAX);
                Some(f.failed_at_ms.saturating_add(wait))
            }
            _ => None,
        }
    }

    /// The only place the state changes.
    fn transition(&mut self, to: StateName) -> Result<Outcome, StateError> {
        let from = self.state;
        if !is_valid_transition(from, to) {
            return Err(StateError::InvalidTransition { from, to });
        }
        self.state = Some(to);
        if to != StateName::Failed {
            self.failure = None;
        }
        Ok(Outcome::Moved(from, to))
    }

    fn not_allowed(&self, command: &'static str) -> StateError {
        match (&self.state, &self.failure) {
            (Some(StateName::Failed), Some(f)) => StateError::FailedPending {
                command,
                message: f.message.clone(),
            },
            (Some(state), _) => StateError::NotAllowed {
                command,
                state: *state,
            },
            (None, _) => StateError::NotStarted { command },
        }
    }

    /// Applies an operator command.
    pub fn command(&mut self, command: Command) -> Result<Outcome, StateError> {
        use StateName::*;
        match command {
            // KIP: start is rejected unless the topic is new or STOPPED; a FAILED partition
            // also takes a manual start (after its automatic retries ran out, or never had any).
            Command::Start => match self.state {
                None | Some(Stopped) | Some(Failed) => {
                    self.consecutive_failures = 0;
                    self.transition(LogAlignment)
                }
                Some(LogAlignment) | Some(Mirroring) => Ok(Outcome::Unchanged),
                Some(_) => Err(self.not_allowed("start")),
            },
            Command::Pause => match self.state {
                Some(Mirroring) => self.transition(Pausing),
                Some(Pausing) | Some(Paused) => Ok(Outcome::Unchanged),
                _ => Err(self.not_allowed("pause")),
            },
            // KIP: resume goes straight to MIRRORING from the local log end, no truncation.
            Command::Resume => match self.state {
                Some(Paused) => self.transition(Mirroring),
                Some(Mirroring) => Ok(Outcome::Unchanged),
                _ => Err(self.not_allowed("resume")),
            },
            Command::Stop => match self.state {
                Some(LogAlignment) | Some(Mirroring) | Some(Pausing) | Some(Paused)
                | Some(Failed) => self.transition(Stopping),
                Some(Stopping) | Some(Stopped) => Ok(Outcome::Unchanged),
                None => Err(self.not_allowed("stop")),
            },
        }
    }

    /// Applies an observation.
    pub fn event(&mut self, event: Event, policy: &RetryPolicy) -> Result<Outcome, StateError> {
        use StateName::*;
        match event {
            Event::Aligned => match self.state {
                Some(LogAlignment) => self.transition(Mirroring),
                _ => Ok(Outcome::Unchanged),
            },
            Event::FetcherRemoved => match self.state {
                Some(Pausing) => self.transition(Paused),
                Some(Stopping) => self.transition(Stopped),
                _ => Ok(Outcome::Unchanged),
            },
            Event::Progressed => {
                if self.state == Some(Mirroring) {
                    self.consecutive_failures = 0;
                }
                Ok(Outcome::Unchanged)
            }
            Event::Failed {
                message,
                retryable,
                now_ms,
            } => {
                let Some(current) = self.state else {
                    return Err(self.not_allowed("fail"));
                };
                // A STOPPED partition is writable and no longer mirrored: nothing can fail it.
                if current == Stopped {
                    return Ok(Outcome::Unchanged);
                }
                let previous = match &self.failure {
                    // Failing again while FAILED keeps the state the failure interrupted.
                    Some(f) => f.previous,
                    None => current,
                };
                let already_final = matches!(
                    self.failure,
                    Some(Failure {
                        retry: Retry::NonRetryable,
                        ..
                    })
                );
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                let retry = if retryable && !already_final {
                    Retry::Attempt(self.consecutive_failures)
                } else {
                    Retry::NonRetryable
                };
                let outcome = self.transition(Failed)?;
                self.failure = Some(Failure {
                    previous,
                    retry,
                    message,
                    failed_at_ms: now_ms,
                });
                Ok(outcome)
            }
            Event::Tick { now_ms } => match self.retry_due_ms(policy) {
                Some(due) if now_ms >= due => {
                    let previous = self.failure.as_ref().map_or(LogAlignment, |f| f.previous);
                    // Back to what the failure interrupted where the KIP table allows it;
                    // everything else restarts with log alignment.
                    let target = match previous {
                        Mirroring => Mirroring,
                        Stopping | Stopped => Stopping,
                        _ => LogAlignment,
                    };
                    self.transition(target)
                }
                _ => Ok(Outcome::Unchanged),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fail(retryable: bool, now_ms: i64) -> Event {
        Event::Failed {
            message: "boom".into(),
            retryable,
            now_ms,
        }
    }

    #[test]
    fn names_round_trip_and_match_the_kip() {
        let names: Vec<&str> = StateName::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "LOG_ALIGNMENT",
                "MIRRORING",
                "PAUSING",
                "PAUSED",
                "STOPPING",
                "STOPPED",
                "FAILED"
            ]
        );
        for s in StateName::ALL {
            assert_eq!(StateName::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert_eq!(StateName::parse("LOG_TRUNCATION"), None);
    }

    #[test]
    fn happy_lifecycle() {
        let p = RetryPolicy::default();
        let mut m = PartitionMachine::new();
        m.command(Command::Start).unwrap();
        assert_eq!(m.state(), Some(StateName::LogAlignment));
        m.event(Event::Aligned, &p).unwrap();
        assert!(m.wants_fetcher());
        m.command(Command::Pause).unwrap();
        assert_eq!(m.state(), Some(StateName::Pausing));
        assert!(!m.wants_fetcher());
        m.event(Event::FetcherRemoved, &p).unwrap();
        assert_eq!(m.state(), Some(StateName::Paused));
        m.command(Command::Resume).unwrap();
        assert_eq!(m.state(), Some(StateName::Mirroring));
        m.command(Command::Stop).unwrap();
        m.event(Event::FetcherRemoved, &p).unwrap();
        assert_eq!(m.state(), Some(StateName::Stopped));
        // A stopped partition may be started again.
        m.command(Command::Start).unwrap();
        assert_eq!(m.state(), Some(StateName::LogAlignment));
    }

    #[test]
    fn rejected_commands_name_the_state() {
        let mut m = PartitionMachine::new();
        m.command(Command::Start).unwrap();
        let err = m.command(Command::Resume).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot resume a partition in state LOG_ALIGNMENT"
        );
        assert_eq!(m.state(), Some(StateName::LogAlignment));
    }

    #[test]
    fn backoff_doubles_from_one_second_to_five_minutes() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (1..=11).map(|n| p.backoff_ms(n)).collect();
        assert_eq!(
            waits,
            [
                1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000,
                300_000
            ]
        );
        assert_eq!(p.backoff_ms(u16::MAX), 300_000);
    }

    #[test]
    fn failure_retries_after_backoff_to_the_interrupted_state() {
        let p = RetryPolicy::default();
        let mut m = PartitionMachine::new();
        m.command(Command::Start).unwrap();
        m.event(Event::Aligned, &p).unwrap();
        m.event(fail(true, 10_000), &p).unwrap();
        let f = m.failure().unwrap().clone();
        assert_eq!(
            (f.previous, f.retry),
            (StateName::Mirroring, Retry::Attempt(1))
        );
        assert_eq!(m.retry_due_ms(&p), Some(11_000));
        assert_eq!(
            m.event(Event::Tick { now_ms: 10_999 }, &p),
            Ok(Outcome::Unchanged)
        );
        m.event(Event::Tick { now_ms: 11_000 }, &p).unwrap();
        assert_eq!(m.state(), Some(StateName::Mirroring));
        assert!(m.failure().is_none());
        // Failing again before any progress: attempt 2 and a doubled backoff.
        m.event(fail(true, 20_000), &p).unwrap();
        assert_eq!(m.failure().unwrap().retry, Retry::Attempt(2));
        assert_eq!(m.retry_due_ms(&p), Some(22_000));
        // Progress after a successful retry starts the count over.
        m.event(Event::Tick { now_ms: 22_000 }, &p).unwrap();
        m.event(Event::Progressed, &p).unwrap();
        m.event(fail(true, 30_000), &p).unwrap();
        assert_eq!(m.failure().unwrap().retry, Retry::Attempt(1));
    }

    #[test]
    fn retries_stop_at_the_maximum_and_need_a_manual_start() {
        let p = RetryPolicy {
            max_attempts: 2,
            ..RetryPolicy::default()
        };
        let mut m = PartitionMachine::new();
        m.command(Command::Start).unwrap();
        for i in 0..3 {
            m.event(fail(true, i * 1_000_000), &p).unwrap();
            m.event(
                Event::Tick {
                    now_ms: i * 1_000_000 + 500_000,
                },
                &p,
            )
            .unwrap();
        }
        assert_eq!(m.state(), Some(StateName::Failed));
        assert_eq!(m.failure().unwrap().retry, Retry::Attempt(3));
        assert_eq!(m.retry_due_ms(&p), None);
        m.command(Command::Start).unwrap();
        assert_eq!(m.state(), Some(StateName::LogAlignment));
    }

    #[test]
    fn non_retryable_failure_never_retries_but_can_be_stopped() {
        let p = RetryPolicy::default();
        let mut m = PartitionMachine::new();
        m.command(Command::Start).unwrap();
        m.event(Event::Aligned, &p).unwrap();
        m.event(fail(false, 0), &p).unwrap();
        assert_eq!(m.failure().unwrap().retry.as_kip_value(), -1);
        assert_eq!(m.retry_due_ms(&p), None);
        assert_eq!(
            m.event(Event::Tick { now_ms: i64::MAX }, &p),
            Ok(Outcome::Unchanged)
        );
        // A later retryable failure does not make it retryable again.
        m.event(fail(true, 1), &p).unwrap();
        assert_eq!(m.failure().unwrap().retry, Retry::NonRetryable);
        assert!(matches!(
            m.command(Command::Pause),
            Err(StateError::FailedPending { .. })
        ));
        m.command(Command::Stop).unwrap();
        m.event(Event::FetcherRemoved, &p).unwrap();
        assert_eq!(m.state(), Some(StateName::Stopped));
    }

    #[test]
    fn restore_rejects_impossible_combinations() {
        assert!(PartitionMachine::restore(StateName::Failed, None).is_none());
        let f = Failure {
            previous: StateName::Mirroring,
            retry: Retry::Attempt(3),
            message: "x".into(),
            failed_at_ms: 0,
        };
        assert!(PartitionMachine::restore(StateName::Paused, Some(f.clone())).is_none());
        let m = PartitionMachine::restore(StateName::Failed, Some(f)).unwrap();
        assert_eq!(m.retry_due_ms(&RetryPolicy::default()), Some(4_000));
    }

    #[derive(Debug, Clone)]
    enum Input {
        Cmd(Command),
        Ev(Event),
    }

    fn input() -> impl Strategy<Value = Input> {
        prop_oneof![
            Just(Input::Cmd(Command::Start)),
            Just(Input::Cmd(Command::Pause)),
            Just(Input::Cmd(Command::Resume)),
            Just(Input::Cmd(Command::Stop)),
            Just(Input::Ev(Event::Aligned)),
            Just(Input::Ev(Event::FetcherRemoved)),
            Just(Input::Ev(Event::Progressed)),
            (any::<bool>(), 0i64..1_000_000_000).prop_map(|(retryable, now_ms)| Input::Ev(
                Event::Failed {
                    message: "e".into(),
                    retryable,
                    now_ms
                }
            )),
            (0i64..2_000_000_000).prop_map(|now_ms| Input::Ev(Event::Tick { now_ms })),
        ]
    }

    proptest! {
        /// No sequence of commands and events makes a handler propose a transition outside the
        /// KIP table, every reported move is in the table, a rejected input changes nothing, and
        /// FAILED always carries its failure (and only FAILED does).
        #[test]
        fn only_valid_transitions(inputs in proptest::collection::vec(input(), 0..64),
                                  max_attempts in 0u16..5) {
            let policy = RetryPolicy { max_attempts, ..RetryPolicy::default() };
            let mut m = PartitionMachine::new();
            for i in inputs {
                let before = m.clone();
                let result = match i {
                    Input::Cmd(c) => m.command(c),
                    Input::Ev(e) => m.event(e, &policy),
                };
                match result {
                    Ok(Outcome::Moved(from, to)) => {
                        prop_assert_eq!(from, before.state());
                        prop_assert_eq!(Some(to), m.state());
                        prop_assert!(is_valid_transition(from, to), "{:?} -> {}", from, to);
                    }
                    Ok(Outcome::Unchanged) => prop_assert_eq!(m.state(), before.state()),
                    Err(StateError::InvalidTransition { from, to }) => {
                        prop_assert!(false, "handler proposed {:?} -> {}", from, to);
                    }
                    Err(_) => prop_assert_eq!(&m, &before),
                }
                prop_assert_eq!(m.state() == Some(StateName::Failed), m.failure().is_some());
                if let Some(f) = m.failure() {
                    prop_assert!(f.previous != StateName::Failed);
                    if let Some(due) = m.retry_due_ms(&policy) {
                        prop_assert!(due - f.failed_at_ms <= MIRROR_RETRY_BACKOFF_MS_MAX as i64);
                        prop_assert!(f.retry != Retry::NonRetryable);
                    }
                }
            }
        }
    }
}
