//! Where new partitions start on the source (`mirror.start.from` = `latest` or a timestamp),
//! asked of each leader once for all of its partitions: one ListOffsets request per leader and
//! start position, plus one more for timestamps newer than every record (those start at the
//! high watermark). A start or resume of thousands of partitions used to open one connection
//! and send one request per partition, on the same worker and within the same deadline as the
//! leader look-up, so the whole batch waited seconds before any partition went to its shard.

use crate::control::mirror_def::StartFrom;
use crate::fetch::blocking::BlockingClient;
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::{Offset, TopicPartition};

/// One partition's start: `None` for earliest (the fetcher starts at the source's log start),
/// else the offset; `Err` says why the source gave none.
pub type Start = Result<Option<Offset>, String>;

/// The start of every partition of `tps` (all led by the broker `client` talks to), in the
/// order asked. `Err` only when a request as a whole failed; each partition's own error code
/// is in its answer.
pub fn start_offsets(
    client: &mut BlockingClient,
    tps: &[TopicPartition],
    start: StartFrom,
) -> Result<Vec<Start>, String> {
    let query = match start {
        StartFrom::Earliest => return Ok(vec![Ok(None); tps.len()]),
        StartFrom::Latest => OffsetQuery::Latest,
        StartFrom::Timestamp(t) => OffsetQuery::Timestamp(t),
    };
    let mut listed = ask(client, tps, query)?;
    // A timestamp newer than every record: the partition starts at its high watermark, asked
    // for all such partitions together.
    let after: Vec<usize> = (0..listed.len())
        .filter(|&i| listed[i] == Listed::NoneAfter)
        .collect();
    if !after.is_empty() && query != OffsetQuery::Latest {
        let again: Vec<TopicPartition> = after.iter().map(|&i| tps[i].clone()).collect();
        for (i, l) in after
            .into_iter()
            .zip(ask(client, &again, OffsetQuery::Latest)?)
        {
            listed[i] = l;
        }
    }
    Ok(listed.into_iter().map(start_of).collect())
}

fn ask(
    client: &mut BlockingClient,
    tps: &[TopicPartition],
    query: OffsetQuery,
) -> Result<Vec<Listed>, String> {
    let answers = client.list_offsets(tps, query).map_err(|e| e.to_string())?;
    // `answers` has one entry per partition asked, in the order asked.
    assert_eq!(
        answers.len(),
        tps.len(),
        "one ListOffsets answer per partition"
    );
    Ok(answers.into_iter().map(|(_, l)| l).collect())
}

fn start_of(listed: Listed) -> Start {
    match listed {
        Listed::At(o) => Ok(Some(o)),
        Listed::NoneAfter => Err("no offset".into()),
        Listed::Error(code) => Err(format!("error code {code}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_starts() {
        assert_eq!(start_of(Listed::At(Offset(42))), Ok(Some(Offset(42))));
        assert!(start_of(Listed::NoneAfter).is_err());
        assert_eq!(start_of(Listed::Error(6)), Err("error code 6".to_string()));
    }
}
