//! Per-partition disk work spread over a few scoped threads: opening, flushing and closing
//! thousands of partition logs is mostly waiting on the filesystem (inode allocation for new
//! files, fsyncs), which one thread does one partition at a time. Each thread has its own copy
//! of the `LogIo` and takes the next item from a shared counter, so the outcome for each item
//! does not depend on the thread count.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::log::io::LogIo;
use crate::log::LogError;

/// Whether the other items go on after one failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterError {
    /// Start no further item (an open that failed abandons the start).
    Stop,
    /// Every item is still done (a flush keeps flushing the other logs).
    Continue,
}

/// Runs `f` on every item on `threads` threads (1: on the caller's). Returns the results in
/// the items' order, `None` for an item not started because an earlier one failed
/// (`AfterError::Stop`).
pub fn on_threads<T, R, I>(
    items: Vec<T>,
    threads: usize,
    io: &mut I,
    after_error: AfterError,
    f: impl Fn(T, &mut I) -> Result<R, LogError> + Sync,
) -> Vec<Option<Result<R, LogError>>>
where
    T: Send,
    R: Send,
    I: LogIo + Clone + Send,
{
    let stop = after_error == AfterError::Stop;
    if threads <= 1 || items.len() <= 1 {
        let mut failed = false;
        return items
            .into_iter()
            .map(|item| {
                if failed && stop {
                    return None;
                }
                let r = f(item, io);
                failed |= r.is_err();
                Some(r)
            })
            .collect();
    }
    let n = items.len();
    let work: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let results: Vec<Mutex<Option<Result<R, LogError>>>> =
        (0..n).map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..threads.min(n) {
            let mut io = io.clone();
            let (work, results, next, failed, f) = (&work, &results, &next, &failed, &f);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || (stop && failed.load(Ordering::Relaxed)) {
                    return;
                }
                let item = lock(&work[i]).take().expect("each item is taken once");
                let r = f(item, &mut io);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                *lock(&results[i]) = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

/// The first error among `results`, else their values (skipped items are not errors: one
/// before them failed, and that is the error).
pub fn first_error<R>(results: Vec<Option<Result<R, LogError>>>) -> Result<Vec<R>, LogError> {
    let mut out = Vec::with_capacity(results.len());
    for r in results.into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::io::StdIo;

    fn fail_at(bad: usize) -> impl Fn(usize, &mut StdIo) -> Result<usize, LogError> + Sync {
        move |i, _| {
            if i == bad {
                Err(LogError::io(
                    std::path::Path::new("x"),
                    std::io::Error::other("disk"),
                ))
            } else {
                Ok(i * 10)
            }
        }
    }

    // Goal: results come back in the items' order whatever the thread count, and with
    // Continue every item runs even after one failed.
    #[test]
    fn results_keep_item_order_and_continue_runs_everything() {
        for threads in [1, 2, 7] {
            let r = on_threads(
                (0..100).collect(),
                threads,
                &mut StdIo,
                AfterError::Continue,
                fail_at(40),
            );
            assert_eq!(r.len(), 100);
            for (i, r) in r.iter().enumerate() {
                match r {
                    Some(Ok(v)) => assert_eq!(*v, i * 10),
                    Some(Err(_)) => assert_eq!(i, 40),
                    None => panic!("item {i} skipped with Continue ({threads} threads)"),
                }
            }
        }
        let ok = on_threads(
            (0..5).collect(),
            3,
            &mut StdIo,
            AfterError::Continue,
            fail_at(99),
        );
        assert_eq!(first_error(ok).unwrap(), vec![0, 10, 20, 30, 40]);
    }

    // Goal: with Stop, nothing starts after a failure on one thread, and the failure is
    // what `first_error` reports.
    #[test]
    fn stop_starts_nothing_after_a_failure() {
        let r = on_threads(
            (0..10).collect(),
            1,
            &mut StdIo,
            AfterError::Stop,
            fail_at(3),
        );
        assert!(r[..3].iter().all(|r| matches!(r, Some(Ok(_)))));
        assert!(matches!(r[3], Some(Err(_))));
        assert!(r[4..].iter().all(Option::is_none));
        assert!(first_error(r).is_err());
        // On threads others may be under way when one fails, but an error is never lost.
        let r = on_threads(
            (0..1000).collect(),
            4,
            &mut StdIo,
            AfterError::Stop,
            fail_at(0),
        );
        assert!(matches!(r[0], Some(Err(_))));
        assert!(first_error(r).is_err());
    }
}
