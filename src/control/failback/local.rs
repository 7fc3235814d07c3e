//! Reading kmirror's own failed-over log for the copy: whole batches from the published read
//! view's segment files (like the Kafka endpoint's readers), never the leader store's memory,
//! so the copy takes no lock that producing clients need.

use crate::ids::Offset;
use crate::log::read_view::PartitionReadView;
use crate::serve::segment_reader::OpenSegment;

/// The batch holding `at` (the first whose last offset is ≥ `at`), if it lies wholly below the
/// view's last stable offset (so every transaction the copy meets is decided on kmirror: its
/// marker will come); `None` when the copy is caught up to it.
pub fn batch_at(view: &PartitionReadView, at: Offset) -> Result<Option<Vec<u8>>, String> {
    let bound = view.last_stable_offset.min(view.high_watermark);
    if at >= bound {
        return Ok(None);
    }
    let mut i = view.segment_for(at);
    while i < view.segments.len() {
        let seg = &view.segments[i];
        if seg.next_offset > at {
            let open = OpenSegment::open(seg).map_err(|e| e.to_string())?;
            if let Some(h) = open.translate(at).map_err(|e| e.to_string())? {
                if h.last_offset >= bound {
                    return Ok(None);
                }
                return open.read_batch(&h).map(Some).map_err(|e| e.to_string());
            }
        }
        i += 1;
    }
    Ok(None)
}

/// The offset after the last batch clients can read (what the copy must reach).
pub fn readable_end(view: &PartitionReadView) -> Offset {
    view.high_watermark
}
