//! Every bound kmirror enforces, in one place, tied together by compile-time assertions.
//!
//! A number that limits memory, a queue, a loop or something read from the wire lives here and
//! nowhere else, so changing a bound is one edit and the relations between bounds are checked by
//! the compiler.

/// Size of the length prefix plus offset that precede every batch: baseOffset (8) + length (4).
pub const LOG_OVERHEAD: usize = 12;

/// Fixed size of a v2 record batch header (up to and including recordsCount).
pub const RECORD_BATCH_V2_HEADER_BYTES: usize = 61;

/// Smallest legacy (magic 0) message: LOG_OVERHEAD + crc, magic, attributes, key len, value len.
pub const LEGACY_RECORD_V0_MIN_BYTES: usize = 26;

/// The largest offset a batch may hold: one below `i64::MAX`, so that the offset after it (the
/// log end once it is appended) is representable. Offsets are int64 in Kafka's protocol and
/// files; a header claiming more is hostile or corrupt and is refused before any offset
/// arithmetic (`wire::batch::Batch::peek`).
pub const OFFSET_MAX: i64 = i64::MAX - 1;

/// Kafka refuses batches whose declared size is below this (it treats them as corruption).
pub const BATCH_BYTES_MIN: usize = 26;

/// The largest record batch kmirror accepts from a source or a client. Kafka's
/// `message.max.bytes` defaults to ~1 MiB but topics may raise `max.message.bytes`; 64 MiB covers
/// every sane configuration while keeping a corrupt length from claiming gigabytes.
pub const BATCH_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Bytes each CRC-32C kernel checksums per calibration round (`wire::crc32c`): big enough to run
/// at streaming speed (a record batch is 16 KiB to 1 MiB), small enough for a core's L2, so the
/// kernels are compared on compute rather than on memory.
pub const CRC_CALIBRATION_BYTES: usize = 256 * 1024;

/// Calibration rounds; the best of each kernel counts. 8 rounds of 256 KiB take ~0.6 ms.
pub const CRC_CALIBRATION_ROUNDS: usize = 8;

/// A log write on the shard thread (`runtime::inline_writes`) is slow when it takes longer than
/// this floor plus its bytes at `INLINE_WRITE_SLOW_BYTES_PER_SEC`: a page-cache copy runs at
/// 1–4 GB/s here (a 1 MiB `.log` write in well under 1 ms), while a writer the kernel throttles
/// for dirtying too much memory sleeps 10–200 ms per write.
pub const INLINE_WRITE_SLOW_FLOOR: std::time::Duration = std::time::Duration::from_millis(2);

/// See `INLINE_WRITE_SLOW_FLOOR`: 256 MB/s, a quarter of the slowest page-cache copy measured.
pub const INLINE_WRITE_SLOW_BYTES_PER_SEC: u64 = 256_000_000;

/// The shard writes itself only while the kernel's dirty plus writeback pages stay below this
/// share (numerator, denominator) of the free-run line past which writers are throttled
/// (`runtime::inline_writes`): 7/8 leaves room for what a shard dirties between two checks.
pub const INLINE_WRITE_FREE_RUN_SHARE: (u64, u64) = (7, 8);

/// How often a shard writing itself rereads `/proc/vmstat` (~30 µs a read): at 2 GB/s a shard
/// dirties 100 MB in 50 ms, well inside the 1/8 margin above on any host with a few GB of RAM.
pub const INLINE_WRITE_DIRTY_CHECK_INTERVAL: std::time::Duration =
    std::time::Duration::from_millis(50);

/// After a slow inline write, a shard's writes go to the ring (an io-wq worker) for this long
/// before the shard tries writing itself again: one possible stall per second at most.
pub const INLINE_WRITE_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);

/// Largest Kafka protocol frame (request or response) we will read. A fetch response is bounded
/// by `fetch.max.bytes` plus per-partition overhead.
pub const FRAME_BYTES_MAX: usize = 128 * 1024 * 1024;

/// Segments are bounded by the int32 positions stored in `.index`.
pub const SEGMENT_BYTES_MAX: u64 = i32::MAX as u64;

/// Kafka's default `segment.bytes` (1 GiB).
pub const SEGMENT_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

/// Kafka's default `segment.ms` (7 days).
pub const SEGMENT_MS_DEFAULT: i64 = 7 * 24 * 60 * 60 * 1000;

/// Kafka's default `index.interval.bytes`.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u32 = 4096;

/// Kafka's default `segment.index.bytes` (10 MiB); the offset index of the active segment is
/// preallocated to this size, rounded down to a multiple of the entry size.
pub const SEGMENT_INDEX_BYTES_DEFAULT: u32 = 10 * 1024 * 1024;

/// `.index` entry: relative offset (int32) + position (int32).
pub const OFFSET_INDEX_ENTRY_BYTES: u32 = 8;

/// `.timeindex` entry: timestamp (int64) + relative offset (int32).
pub const TIME_INDEX_ENTRY_BYTES: u32 = 12;

/// `.txnindex` entry: version, producerId, firstOffset, lastOffset, lastStableOffset.
pub const TXN_INDEX_ENTRY_BYTES: u32 = 34;

/// Producer snapshot entry size (version 1 layout).
pub const PRODUCER_SNAPSHOT_ENTRY_BYTES: usize = 46;

/// Longest topic name Kafka allows.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;

/// Largest request the synthetic bench source reads (a Fetch for thousands of partitions is a
/// few hundred KiB).
pub const SYNTH_REQUEST_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The synthetic source honours a Fetch's max_wait_ms up to this many milliseconds.
pub const SYNTH_MAX_WAIT_MS_MAX: u64 = 1_000;

/// Most partitions (over all topics) one synthetic source serves.
pub const SYNTH_PARTITIONS_MAX: usize = 65_536;

/// A response still arriving is read on (its whole partition entries validated and written)
/// each time this many more of its bytes came in: often enough that an entry is copied to the
/// page cache while its bytes are still in the core's cache, seldom enough that the retries of
/// an entry not yet whole cost nothing.
pub const FETCH_READ_EARLY_STEP_BYTES: usize = 128 * 1024;

/// Read size of the raw-copy bench client: big enough to amortise syscalls, small enough to
/// stay in L2/L3 between the socket read and the file write.
pub const RAW_COPY_CHUNK_BYTES: usize = 1024 * 1024;

/// Where in its read buffer the raw-copy client puts the bytes it reads, by default. At 0, the
/// lz4 stream of the 16 KiB-batch cells made the kernel's socket-to-user copy twice as costly on
/// the test VM as at any offset from 4 to 2,048 bytes, while zstd cost the same everywhere
/// (benches/RESULTS.md, session 26): the copy limit must not rest on an unlucky placement.
pub const RAW_COPY_READ_OFFSET_BYTES: usize = 64;

/// Slices handed to one `writev`: Linux's IOV_MAX.
pub const IOV_PER_WRITE_MAX: usize = 1024;

const _: () = assert!(BATCH_BYTES_MAX <= FRAME_BYTES_MAX);
const _: () = assert!(SYNTH_REQUEST_BYTES_MAX <= FRAME_BYTES_MAX);
const _: () = assert!((BATCH_BYTES_MAX as u64) < SEGMENT_BYTES_MAX);
const _: () = assert!(SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);

/// An active segment's `.log` gets disk blocks reserved ahead of its end (`log::preallocate`)
/// once it holds this much: a partition that holds a few records never asks for any, and one
/// that grows asks about once per doubling until the steps reach their cap.
pub const LOG_PREALLOCATE_FROM_BYTES: u64 = 64 * 1024;
/// The most reserved ahead of an active `.log`'s end at once. A reservation covers at most as
/// much again as the segment holds, so the unused blocks of all active segments together stay
/// below both their data and this much per partition; a roll gives them back.
pub const LOG_PREALLOCATE_AHEAD_MAX: u64 = 8 * 1024 * 1024;
const _: () = assert!(LOG_PREALLOCATE_FROM_BYTES <= LOG_PREALLOCATE_AHEAD_MAX);
const _: () = assert!(RECORD_BATCH_V2_HEADER_BYTES > LOG_OVERHEAD);
const _: () = assert!(SEGMENT_INDEX_BYTES_DEFAULT % OFFSET_INDEX_ENTRY_BYTES == 0);

/// Largest text checkpoint or small metadata file we read into memory. A log dir with 100k
/// partitions writes ~40 bytes per entry, so 64 MiB leaves ample room.
pub const CHECKPOINT_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Data batches per producer a leader remembers to recognise a retried produce (Kafka's
/// `ProducerStateEntry.NUM_BATCHES_TO_RETAIN`; a producer keeps at most five requests in flight).
pub const PRODUCER_RECENT_BATCHES: usize = 5;

/// Kafka's default `max.message.bytes` (1 MiB + record batch overhead): the largest batch a
/// producer may write to a failed-over partition.
pub const MAX_MESSAGE_BYTES_DEFAULT: usize = 1_048_588;

/// Producer ids kmirror hands out after failover start at least here: Kafka clusters allocate
/// producer ids in blocks of 1,000 upwards from 0, so mirrored data would need 2^40 (10^12)
/// producers to reach it.
pub const PRODUCER_ID_FLOOR: i64 = 1 << 40;

/// Producer ids persisted per allocation write (Kafka's controller uses the same block size).
pub const PRODUCER_ID_BLOCK_SIZE: i64 = 1_000;

/// Largest producer snapshot we read: 10 bytes of header plus 46 per producer, so 1 GiB holds
/// over 23 million producers, far beyond any real partition.
pub const PRODUCER_SNAPSHOT_BYTES_MAX: u64 = 1024 * 1024 * 1024;

// ---- Source client (fetch/) ----

/// Requests one source connection may have outstanding. The fetcher keeps one fetch in flight
/// per broker (as Kafka's replica fetcher does); a little headroom covers a metadata or
/// ListOffsets call issued alongside it by the blocking driver.
pub const SOURCE_IN_FLIGHT_MAX: usize = 4;

/// Partitions one fetcher (one source broker) may own. Bounds the request size and the
/// per-response lookup work.
pub const FETCHER_PARTITIONS_MAX: usize = 16 * 1024;

/// Upper bound on `fetch.max.bytes` we ask a source for; a response carries at most this much
/// record data plus per-partition overhead, so it must fit in a frame.
pub const FETCH_RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Upper bound on `max_wait_ms` in a fetch request (a long poll longer than this only delays
/// shutdown and rebalancing).
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;

/// Retry backoff after a source error: starts here and doubles per consecutive failure...
pub const SOURCE_BACKOFF_MS_MIN: u64 = 100;
/// ...up to here (Kafka's `retry.backoff.max.ms` default is 1 s; sources recover slowly after
/// a broker restart, so we allow longer).
pub const SOURCE_BACKOFF_MS_MAX: u64 = 10_000;

/// Largest throttle a source may impose on us. Brokers cap quota delays at their
/// `quota.window.size.seconds * num` (default 11 s); anything larger is treated as this.
pub const SOURCE_THROTTLE_MS_MAX: u64 = 60_000;

/// Source calls of the control plane in flight at once (`control::source_worker`), each on its
/// own thread. With at most one call of each kind per mirror in flight, this is reached only
/// with many mirrors whose sources all hang; further calls wait for the next tick.
pub const SOURCE_WORKERS_MAX: usize = 64;

/// Socket timeouts of the blocking driver (control-thread tools and tests).
pub const BLOCKING_CONNECT_TIMEOUT_MS: u64 = 10_000;
pub const BLOCKING_IO_TIMEOUT_MS: u64 = FETCH_WAIT_MS_MAX as u64 + 30_000;

const _: () = assert!(FETCH_RESPONSE_BYTES_MAX < FRAME_BYTES_MAX);
const _: () = assert!(BATCH_BYTES_MAX <= FETCH_RESPONSE_BYTES_MAX);
const _: () = assert!(SOURCE_BACKOFF_MS_MIN <= SOURCE_BACKOFF_MS_MAX);
const _: () = assert!(BLOCKING_IO_TIMEOUT_MS > FETCH_WAIT_MS_MAX as u64);

/// Smallest `segment.bytes` Kafka accepts (LegacyRecord.RECORD_OVERHEAD_V0).
pub const SEGMENT_BYTES_MIN: u64 = 14;

/// Smallest `segment.index.bytes` we accept: room for a few entries of either index, so that
/// "full" (time index at maxEntries − 1) is never true for an empty index.
pub const SEGMENT_INDEX_BYTES_MIN: u32 = 4 * TIME_INDEX_ENTRY_BYTES;

/// Bytes read from a `.log` file to look at one batch header without reading the batch:
/// the whole v2 header (legacy headers are shorter).
pub const BATCH_HEADER_PEEK_BYTES: usize = RECORD_BATCH_V2_HEADER_BYTES;

/// Read buffer used when walking the batches of a `.log` file (recovery, verify, dump). It grows
/// to hold a single larger batch, up to `BATCH_BYTES_MAX`.
pub const SEGMENT_SCAN_BUFFER_BYTES: usize = 1024 * 1024;

const _: () = assert!(SEGMENT_SCAN_BUFFER_BYTES <= BATCH_BYTES_MAX);

// ---- runtime (shards, rings, arenas) ----

/// Submission-queue entries per shard ring. Sized for every op a shard can have in flight at once
/// (see `RING_OPS_IN_FLIGHT_MAX`) so a full slab never finds the SQ full as well.
pub const RING_SQ_ENTRIES: u32 = 256;

/// Completion-queue entries: 4x the SQ so bursts of completions never overflow the CQ.
pub const RING_CQ_ENTRIES: u32 = 4 * RING_SQ_ENTRIES;

/// Asynchronous ops a shard may have in flight: the op slab is allocated once with this many
/// entries. One recv + one send + one timeout per source connection, the wakeup read, plus room.
pub const RING_OPS_IN_FLIGHT_MAX: usize = 192;

/// Op slab entries only the shard loop's own ops may take (the wakeup read and the heartbeat
/// timeout), so the handler's ops never leave them without one.
pub const RING_OPS_RESERVED: usize = 2;
const _: () = assert!(RING_OPS_RESERVED < RING_OPS_IN_FLIGHT_MAX);

/// FSYNCs of log flushes a shard keeps on its ring at once (`mirror_shard_flush`); the rest
/// queue. A sixth of the op slots: a checkpoint round over thousands of logs must leave the
/// sources' sends, receives and timers their slots.
pub const SHARD_FSYNCS_IN_FLIGHT_MAX: usize = RING_OPS_IN_FLIGHT_MAX / 6;
const _: () = assert!(SHARD_FSYNCS_IN_FLIGHT_MAX >= 1);

/// File writes of one `Ring::write_batch` (a fetch response's appends) in flight at once: their
/// completions fit the CQ next to every async op's.
pub const RING_WRITE_BATCH_MAX: usize = 512;

/// Smallest arena slot: must hold a useful fetch response (1 MiB, Kafka's default
/// `max.partition.fetch.bytes`) plus the frame and response headers.
pub const ARENA_SLOT_BYTES_MIN: usize = 64 * 1024;

/// Largest arena slot: one slot holds one whole response frame.
pub const ARENA_SLOT_BYTES_MAX: usize = FRAME_BYTES_MAX;

/// Slots per arena; slot indexes are u32 and the free list is allocated once at this size.
pub const ARENA_SLOTS_MAX: usize = 4096;

/// Largest single registered buffer the kernel accepts (1 GiB); bigger arenas register chunks.
pub const ARENA_REGISTERED_CHUNK_BYTES_MAX: usize = 1024 * 1024 * 1024;

/// Largest arena per shard (16 GiB): far beyond what a shard can fill between appends, and
/// keeps `slot_count * slot_bytes` far from overflow.
pub const ARENA_BYTES_MAX: usize = 16 * 1024 * 1024 * 1024;

/// Registered chunks per arena (the kernel's fixed-buffer table is indexed by u16). A chunk holds
/// as many whole slots as fit in 1 GiB, so it is never shorter than 1 GiB minus one largest slot.
pub const ARENA_CHUNKS_MAX: usize =
    ARENA_BYTES_MAX / (ARENA_REGISTERED_CHUNK_BYTES_MAX - ARENA_SLOT_BYTES_MAX) + 1;

/// Shards (pinned threads) per process.
pub const SHARDS_MAX: usize = 256;

/// Messages the control thread may queue to one shard before it must wait.
pub const MAILBOX_TO_SHARD_CAPACITY: usize = 1024;

/// Events one shard may queue to the control thread before it must wait.
pub const MAILBOX_TO_CONTROL_CAPACITY: usize = 1024;

/// Events a shard holds, in order, while its queue to the control thread is full (a few per
/// partition: 16 per partition at `FETCHER_PARTITIONS_MAX`).
pub const SHARD_EVENTS_HELD_MAX: usize = 16 * FETCHER_PARTITIONS_MAX;

const _: () = assert!(ARENA_SLOT_BYTES_MIN <= ARENA_SLOT_BYTES_MAX);
const _: () = assert!(ARENA_SLOT_BYTES_MAX <= ARENA_REGISTERED_CHUNK_BYTES_MAX);
const _: () = assert!(ARENA_SLOTS_MAX <= u32::MAX as usize);
const _: () = assert!(ARENA_CHUNKS_MAX <= u16::MAX as usize);
const _: () = assert!(RING_OPS_IN_FLIGHT_MAX <= RING_SQ_ENTRIES as usize);
const _: () = assert!(RING_CQ_ENTRIES >= 2 * RING_SQ_ENTRIES);
const _: () =
    assert!(RING_WRITE_BATCH_MAX + RING_OPS_IN_FLIGHT_MAX + 2 <= RING_CQ_ENTRIES as usize);

/// Bytes a fetch response may carry beyond its record data: response, topic and partition
/// headers (about 60 bytes per partition) and aborted-transaction lists, for up to
/// `FETCHER_PARTITIONS_MAX` partitions.
pub const RESPONSE_OVERHEAD_BYTES_MAX: usize = 1024 * 1024;

/// Retries (after a backoff each) of a partition whose fetched records fail their CRC or
/// framing, before it is stopped: a flipped bit in transit heals on refetch, the same bad
/// bytes every time do not.
pub const FETCH_BAD_RECORDS_RETRIES: u32 = 3;

/// Fetch sessions (each with one request in flight) per source connection: a connection's
/// partitions are split into this many groups at most. Each group keeps its own correlation
/// ids and session; responses are matched to groups by their order on the socket.
pub const SOURCE_FETCH_SESSIONS_MAX: usize = 8;
/// Default `fetch.sessions_per_connection`: one, Kafka's replica-fetcher behaviour. The source
/// answers a connection's requests one at a time, so with several groups an idle group's long
/// poll delays the other groups' data by up to `max_wait_ms`; a connection behind gets a second
/// group only while it is behind (`fetch.catch_up_pipelining`, `runtime::mirror_shard_split`).
pub const SOURCE_FETCH_SESSIONS_DEFAULT: u8 = 1;

const _: () = assert!(
    SOURCE_FETCH_SESSIONS_DEFAULT >= 1
        && SOURCE_FETCH_SESSIONS_DEFAULT as usize <= SOURCE_FETCH_SESSIONS_MAX
);

/// Answers in a row, each showing a backlog at the source (`runtime::mirror_shard_split`'s
/// `Backlog`), before a connection with one fetch group splits it in two to catch up: one
/// such answer may be a burst, two are a backlog.
pub const CATCH_UP_SPLIT_AFTER_RESPONSES: u32 = 2;

/// Connections one shard may open to one source broker (`fetch.connections_per_source`): its
/// partitions there are split between them, each connection with its own fetch groups. A
/// broker parks each connection's long poll on its own, so unlike several groups on one
/// connection, several connections pipeline without holding idle partitions back.
pub const SOURCE_CONNECTIONS_MAX: usize = 8;
/// Default `fetch.connections_per_source`: one, as Kafka's replica fetcher (per fetcher thread).
pub const SOURCE_CONNECTIONS_DEFAULT: u8 = 1;

const _: () = assert!(
    SOURCE_CONNECTIONS_DEFAULT >= 1
        && SOURCE_CONNECTIONS_DEFAULT as usize <= SOURCE_CONNECTIONS_MAX
);

/// Delay before reconnecting to a source broker after the connection failed or broke.
pub const SOURCE_RECONNECT_MS: u64 = SOURCE_BACKOFF_MS_MIN;

/// Delay before retrying to take an arena slot when all are in use (they return as soon as the
/// previous responses' records are appended).
pub const ARENA_RETRY_MS: u64 = 1;

/// Source brokers one shard may hold connections to; a tag carries the index in 24 bits.
pub const SHARD_SOURCES_MAX: usize = 1 << 16;

const _: () =
    assert!(FETCH_RESPONSE_BYTES_MAX + RESPONSE_OVERHEAD_BYTES_MAX <= ARENA_SLOT_BYTES_MAX);

// ---- control plane ----
/// First wait before the control thread asks the source again for a partition's leader (no
/// leader yet, topic missing, source unreachable); doubled per failed attempt.
pub const LEADER_REFRESH_MS_MIN: u64 = 200;
/// Longest wait between leader look-ups: a broker restart should be noticed within seconds.
pub const LEADER_REFRESH_MS_MAX: u64 = 3_000;

const _: () = assert!(LEADER_REFRESH_MS_MIN <= LEADER_REFRESH_MS_MAX);

/// First wait before a FAILED mirror partition retries (KIP `mirror.failed.retry.initial.backoff.ms`).
pub const MIRROR_RETRY_BACKOFF_MS_INITIAL: u64 = 1_000;
/// Longest wait between retries (KIP `mirror.failed.retry.max.backoff.ms`).
pub const MIRROR_RETRY_BACKOFF_MS_MAX: u64 = 300_000;
/// Automatic retries before a manual start is needed (KIP `mirror.failed.retry.max.attempts`).
pub const MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT: u16 = 100;

const _: () = assert!(MIRROR_RETRY_BACKOFF_MS_INITIAL <= MIRROR_RETRY_BACKOFF_MS_MAX);

/// Longest mirror name (kip1279.md §2, the same bound as a topic name).
pub const MIRROR_NAME_BYTES_MAX: usize = 249;

/// Largest mirror `.properties` file we read: a client config is a few KiB.
pub const MIRROR_PROPERTIES_BYTES_MAX: usize = 1024 * 1024;

/// Segment size of the keyed logs (`__mirror_state`, `__consumer_offsets`): they are compacted
/// at every start, so one segment normally holds them; a roll now and then costs nothing.
pub const KEYED_LOG_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes read per step when replaying a keyed log.
pub const KEYED_LOG_READ_BYTES: u64 = 1024 * 1024;

const _: () = assert!(KEYED_LOG_SEGMENT_BYTES <= SEGMENT_BYTES_MAX);

/// Period of the control thread's housekeeping (FAILED retries whose backoff elapsed). The
/// backoff starts at 1 s, so a finer tick only burns CPU.
pub const CONTROL_TICK_MS: u64 = 250;

/// Default period of retention passes over the partition logs (Kafka's
/// `log.retention.check.interval.ms`), and its bounds for `admin.retention_check_interval_ms`.
pub const RETENTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 300_000;
pub const RETENTION_CHECK_INTERVAL_MS_MIN: u64 = 1_000;
pub const RETENTION_CHECK_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const _: () = assert!(
    RETENTION_CHECK_INTERVAL_MS_MIN <= RETENTION_CHECK_INTERVAL_MS_DEFAULT
        && RETENTION_CHECK_INTERVAL_MS_DEFAULT <= RETENTION_CHECK_INTERVAL_MS_MAX
);

/// Default period of the source sync (new topics, partition growth, deletions, cluster id).
pub const MIRROR_SYNC_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// Bounds of `admin.sync_interval_ms`: below a second the source sees a metadata storm; above a
/// day a deleted topic would go unnoticed for too long.
pub const MIRROR_SYNC_INTERVAL_MS_MIN: u64 = 1_000;
pub const MIRROR_SYNC_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const _: () = assert!(
    MIRROR_SYNC_INTERVAL_MS_MIN <= MIRROR_SYNC_INTERVAL_MS_DEFAULT
        && MIRROR_SYNC_INTERVAL_MS_DEFAULT <= MIRROR_SYNC_INTERVAL_MS_MAX
);

/// Shortest admin bearer token accepted (`[admin] token_file`): 16 random characters are
/// beyond guessing over HTTP; fewer are usually a placeholder someone forgot.
pub const ADMIN_TOKEN_CHARS_MIN: usize = 16;
/// A TLS client of the admin API must finish its handshake within this, so a connection that
/// never speaks holds nothing for long.
pub const ADMIN_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Admin TLS handshakes done but not yet taken by the HTTP server; more wait in the kernel's
/// accept queue.
pub const ADMIN_TLS_READY_MAX: usize = 64;

/// How long the control thread waits for a shard to hand a removed partition's log back (a
/// shard answers between two ring waits, so this only bounds a stuck shard).
pub const SHARD_REMOVE_WAIT_MS: u64 = 10_000;

/// Bounds of `fetch.request_timeout_ms`: how long a source response may take beyond the fetch's
/// `max_wait_ms` before the connection is dropped (Kafka's `request.timeout.ms` is 30 s).
pub const SOURCE_REQUEST_TIMEOUT_MS_MIN: u32 = 100;
pub const SOURCE_REQUEST_TIMEOUT_MS_MAX: u32 = 300_000;
pub const SOURCE_REQUEST_TIMEOUT_MS_DEFAULT: u32 = 30_000;
const _: () = assert!(
    SOURCE_REQUEST_TIMEOUT_MS_MIN <= SOURCE_REQUEST_TIMEOUT_MS_DEFAULT
        && SOURCE_REQUEST_TIMEOUT_MS_DEFAULT <= SOURCE_REQUEST_TIMEOUT_MS_MAX
);

// ---- consumer groups (serve/groups, control/group_sync) ----

/// Session timeouts a member may ask for (Kafka's `group.min.session.timeout.ms` and
/// `group.max.session.timeout.ms` defaults).
pub const GROUP_SESSION_TIMEOUT_MS_MIN: i32 = 6_000;
pub const GROUP_SESSION_TIMEOUT_MS_MAX: i32 = 1_800_000;

/// Longest rebalance timeout honoured (a client asking for more gets this): a JoinGroup waits
/// on an endpoint thread for at most this long before the round ends without the laggards.
pub const GROUP_REBALANCE_TIMEOUT_MS_MAX: i32 = 1_800_000;

/// How long an endpoint thread waits for the answer to its parked JoinGroup/SyncGroup before
/// giving up. The coordinator answers within a rebalance timeout (join) or a session timeout
/// (sync), so this is only a backstop.
pub const GROUP_PARK_MAX_MS: u64 =
    GROUP_REBALANCE_TIMEOUT_MS_MAX as u64 + GROUP_SESSION_TIMEOUT_MS_MAX as u64 + 60_000;

/// Longest sleep of the group timer thread when no deadline is nearer (it is woken on every
/// group change anyway).
pub const GROUP_TIMER_MAX_SLEEP_MS: u64 = 1_000;

/// How long shutdown waits for connection threads to let go of the coordinator before it
/// leaves `__consumer_offsets-0` to the next start's recovery instead of closing it.
pub const GROUP_CLOSE_WAIT_MS: u64 = 3_000;

/// Kafka's `group.initial.rebalance.delay.ms` default: the first rebalance of an empty group
/// waits this long for more members, so a starting fleet does not rebalance once per member.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT: i64 = 3_000;

/// Most `[kafka] group_initial_rebalance_delay_ms` accepts: a JoinGroup holds its connection's
/// handler for this long, so minutes would be a misconfiguration, not a choice.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_MAX: i64 = 300_000;

/// Members of one group (Kafka's `group.max.size` is unbounded by default; a bound keeps one
/// group from taking the coordinator's memory).
pub const GROUP_MEMBERS_MAX: usize = 1_000;

/// Groups the coordinator keeps (with members or with committed offsets only).
pub const GROUPS_MAX: usize = 100_000;

/// Longest group id, member id, client id or instance id accepted (bytes).
pub const GROUP_ID_BYTES_MAX: usize = 1_024;

/// Kafka's `offset.metadata.max.bytes` default: longer commit metadata gets
/// OFFSET_METADATA_TOO_LARGE.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4_096;

/// Largest protocol metadata or assignment one member may hand the coordinator.
pub const GROUP_MEMBER_BLOB_BYTES_MAX: usize = 1024 * 1024;

/// Committed offsets kept over all groups (each costs a key in `__consumer_offsets`).
pub const COMMITTED_OFFSETS_MAX: usize = 10_000_000;

/// Default period of the group-offset sync from a mirror's source
/// (`sync.group.offsets.interval.ms`, as Cluster Linking's and KIP-1279's 30 s).
pub const GROUP_SYNC_INTERVAL_MS_DEFAULT: u64 = 30_000;
/// Bounds of `sync.group.offsets.interval.ms`.
pub const GROUP_SYNC_INTERVAL_MS_MIN: u64 = 100;
pub const GROUP_SYNC_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// How long one periodic group-sync round of one mirror may wait for its source.
pub const GROUP_SYNC_ROUND_TIMEOUT_MS: u64 = 10_000;

/// How long the last group sync at failover (`mirrors stop`) may wait for the source by
/// default (`sync.group.offsets.final.timeout.ms`); a dead source must not hold the failover
/// up, and a slow one past this bound means the consumers resume from the last periodic sync.
pub const GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const GROUP_SYNC_FINAL_TIMEOUT_MS_MIN: u64 = 100;
pub const GROUP_SYNC_FINAL_TIMEOUT_MS_MAX: u64 = 600_000;

/// Groups read from one source per sync round; the rest wait for the next round.
pub const GROUP_SYNC_GROUPS_MAX: usize = 10_000;

const _: () = assert!(GROUP_SESSION_TIMEOUT_MS_MIN <= GROUP_SESSION_TIMEOUT_MS_MAX);
const _: () = assert!(GROUP_SYNC_INTERVAL_MS_MIN <= GROUP_SYNC_INTERVAL_MS_DEFAULT);
const _: () = assert!(GROUP_SYNC_INTERVAL_MS_DEFAULT <= GROUP_SYNC_INTERVAL_MS_MAX);
const _: () = assert!(GROUP_SYNC_FINAL_TIMEOUT_MS_MIN <= GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT);
const _: () = assert!(GROUP_SYNC_FINAL_TIMEOUT_MS_DEFAULT <= GROUP_SYNC_FINAL_TIMEOUT_MS_MAX);
const _: () = assert!(GROUP_MEMBER_BLOB_BYTES_MAX < FRAME_BYTES_MAX);
// ---- Kafka endpoint (serve) ----

/// Largest request frame a client may send (Kafka's `socket.request.max.bytes` default).
pub const SERVE_REQUEST_BYTES_MAX: usize = 100 * 1024 * 1024;

/// Default `kafka.max_connections` (Kafka's `max.connections`): connections served at once; one
/// more is accepted and closed at once, counted in /metrics. Kafka's default is unlimited; each
/// connection holds a file descriptor, so the default is bounded.
pub const SERVE_CONNECTIONS_DEFAULT: usize = 1024;

/// Highest `kafka.max_connections` (and `max_connections_per_ip`) accepted: one file descriptor
/// each (a connection is a task on the endpoint's runtime, a few KB when idle).
pub const SERVE_CONNECTIONS_MAX: usize = 16_384;

/// Default `kafka.connections_max_idle_ms` (Kafka's `connections.max.idle.ms`, 10 min): a
/// connection with no request for this long is closed.
pub const SERVE_CONNECTIONS_MAX_IDLE_MS_DEFAULT: u64 = 600_000;

/// Default `kafka.request_receive_timeout_ms`: once a request's first byte has arrived, the
/// whole frame must arrive within this (Kafka's clients' `request.timeout.ms` default: a client
/// that has not sent its request by then has given up on it), else the connection is closed.
pub const SERVE_REQUEST_RECEIVE_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// Bounds of both timeouts above.
pub const SERVE_CONN_TIMEOUT_MS_MIN: u64 = 100;
pub const SERVE_CONN_TIMEOUT_MS_MAX: u64 = 7 * 24 * 60 * 60 * 1000;

/// Default `kafka.queued_max_request_bytes` (Kafka's `queued.max.request.bytes`, unlimited by
/// default there): request bytes all connections may buffer at once. A connection whose frame
/// does not fit waits for others' bytes to be freed (up to its receive timeout) instead of
/// allocating; a frame larger than the whole budget closes its connection.
pub const SERVE_QUEUED_REQUEST_BYTES_DEFAULT: usize = 512 * 1024 * 1024;

/// Smallest `kafka.queued_max_request_bytes`.
pub const SERVE_QUEUED_REQUEST_BYTES_MIN: usize = 64 * 1024;

/// Longest a Fetch may wait for `min_bytes` (a client's larger `max_wait_ms` is cut to this).
pub const SERVE_FETCH_WAIT_MS_MAX: u64 = FETCH_WAIT_MS_MAX as u64;

/// How often a waiting Fetch looks at the published views again.
pub const SERVE_FETCH_POLL_MS: u64 = 5;

/// Most record bytes one Fetch response carries (a client's larger `max_bytes` is cut to this).
pub const SERVE_FETCH_RESPONSE_BYTES_MAX: u64 = FETCH_RESPONSE_BYTES_MAX as u64;

/// How long a connection may block writing one response before it is closed.
pub const SERVE_WRITE_TIMEOUT_MS: u64 = 30_000;

/// Fetch sessions (KIP-227) the endpoint keeps at once, over all clients (Kafka's
/// `max.incremental.fetch.session.cache.slots` default). When all are taken a full fetch gets
/// session id 0 (the client keeps sending full fetches) unless a session can be evicted.
pub const SERVE_FETCH_SESSIONS_MAX: usize = 1_000;

/// A session unused this long may be evicted for a new one; a session created longer ago than
/// this may also give way to a new one with more partitions (Kafka's fixed 120 s).
pub const SERVE_FETCH_SESSION_EVICTION_MS: u64 = 120_000;

/// Partitions one fetch session may hold: a full fetch asking for more gets no session, and
/// an incremental fetch growing a session past it closes the session. Bounds the memory a
/// client can pin with partitions added one request at a time.
pub const SERVE_FETCH_SESSION_PARTITIONS_MAX: usize = 100_000;

/// API keys the endpoint's request counters have a row for (Kafka 4.x uses keys below 100);
/// requests with a larger key are counted together, unlabelled.
pub const SERVE_STATS_API_KEYS: usize = 128;

/// Versions per API the request counters have a column for (no Kafka API is above v17).
pub const SERVE_STATS_VERSIONS: usize = 32;

/// Decoding a request may allocate this many bytes per request byte, plus the floor below
/// (the vendored decoder's budget). Honest requests of stock clients stay near 2.5 (Fetch
/// v12+), 5 at worst (Fetch v4: 16 encoded bytes per 80-byte partition); a count that would
/// need more is refused before anything is reserved for it.
pub const SERVE_DECODE_BYTES_PER_REQUEST_BYTE: usize = 6;

/// Decode budget every request gets whatever its size, so small requests of any shape pass.
pub const SERVE_DECODE_BUDGET_FLOOR_BYTES: usize = 256 * 1024;

const _: () = assert!(SERVE_REQUEST_BYTES_MAX <= FRAME_BYTES_MAX);

// ---- Kafka endpoint: event-driven I/O and listeners (netio) ----

/// Threads of the endpoint's tokio runtime that read frames, write responses and run TLS for
/// every connection (the box has 2 cores; handlers do not run on them).
pub const SERVE_IO_THREADS: usize = 2;

/// Most threads running request handlers at once. Handlers are synchronous and some park (a
/// Fetch waits up to `SERVE_FETCH_WAIT_MS_MAX` for data, a JoinGroup for its rebalance), so
/// the pool is large enough that parked requests do not starve the rest; requests beyond it
/// queue. Idle pool threads exit after `SERVE_DISPATCH_THREAD_KEEP_ALIVE_MS`.
pub const SERVE_DISPATCH_THREADS_MAX: usize = 256;
pub const SERVE_DISPATCH_THREAD_KEEP_ALIVE_MS: u64 = 10_000;

/// Fetches that may wait for data (long poll) at once, each parking a handler thread: half the
/// pool, so parked fetches never hold the threads every other request needs
/// (`serve::fetch_park`); a Fetch past it is answered at once with what there is.
pub const SERVE_FETCH_PARKED_MAX: usize = SERVE_DISPATCH_THREADS_MAX / 2;
const _: () =
    assert!(SERVE_FETCH_PARKED_MAX > 0 && SERVE_FETCH_PARKED_MAX < SERVE_DISPATCH_THREADS_MAX);

/// Named listeners (`[[kafka.listeners]]`) one endpoint may have.
pub const SERVE_LISTENERS_MAX: usize = 16;

/// Bytes of a segment file read at once when a response goes out through TLS (no `sendfile`
/// there: the bytes must pass through the encryption in user space).
pub const SERVE_TLS_FILE_CHUNK_BYTES: usize = 256 * 1024;

/// (listener, principal) pairs whose TLS connections /metrics counts one by one; connections of
/// further principals are counted under `principal="other"` (a label per client certificate
/// must not grow without bound).
pub const SERVE_TLS_PRINCIPALS_TRACKED: usize = 1_000;

/// How long stopping the endpoint waits for handlers still running before it lets them go.
pub const SERVE_STOP_WAIT_MS: u64 = 5_000;
const _: () = assert!(SERVE_FETCH_RESPONSE_BYTES_MAX < i32::MAX as u64);
/// SCRAM iteration counts a source may ask for: Kafka's own bounds (below 4096 is too weak to
/// accept, above 16384 Kafka never stores, and a hostile count would burn the control thread).
pub const SCRAM_ITERATIONS_MIN: u32 = 4096;
pub const SCRAM_ITERATIONS_MAX: u32 = 16384;
const _: () = assert!(SCRAM_ITERATIONS_MIN <= SCRAM_ITERATIONS_MAX);

/// Random bytes in a SCRAM client nonce (base64-encoded on the wire).
pub const SCRAM_NONCE_BYTES: usize = 24;

/// Length of one latency interval: shards hand their histograms over this often, and each
/// interval becomes one entry per latency in the HdrHistogram interval log.
pub const LATENCY_INTERVAL_MS: u64 = 1_000;

/// Latency sets in circulation per shard beyond the one being recorded (blank + handed over);
/// if the control side falls this many intervals behind, shards keep recording into longer
/// intervals instead of allocating.
pub const LATENCY_EXCHANGE_DEPTH: usize = 4;

/// Largest latency a histogram records (1 hour, in ns); larger samples are clamped. End-to-end
/// latency of history mirrored long after it was produced is clamped here.
pub const LATENCY_MAX_NS: u64 = 3_600 * 1_000_000_000;

/// HdrHistogram precision: 3 significant digits (0.1% value error), the usual setting.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// A latency interval log is rotated once it holds this many bytes...
pub const LATENCY_LOG_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// ...or has been written for this long.
pub const LATENCY_LOG_SECS_MAX: u64 = 6 * 3_600;

/// Interval logs kept under `<data_dir>/latency` (oldest deleted first): about a week at the
/// age limit.
pub const LATENCY_LOG_FILES_MAX: usize = 28;

/// `kmirror doctor` fails below this much free space in the data dir's filesystem: segments
/// roll at up to 1 GiB each, so less cannot hold even one more segment per partition.
pub const DOCTOR_FREE_BYTES_FAIL: u64 = 1 << 30;

/// ...and warns below this.
pub const DOCTOR_FREE_BYTES_WARN: u64 = 10 << 30;

/// `kmirror mirrors stop --promote` waits this long for zero lag by default, then gives up
/// without stopping anything.
pub const PROMOTE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// ...asking the admin API again this often (each ask is one ListOffsets per source leader)...
pub const PROMOTE_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// ...and telling the operator what is still behind at most this often.
pub const PROMOTE_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Kafka's `transaction.max.timeout.ms` default: InitProducerId refuses longer timeouts.
pub const TXN_TIMEOUT_MS_MAX: i32 = 900_000;

/// Transactional ids the coordinator keeps (each is a key in `__transaction_state-0`).
pub const TXN_IDS_MAX: usize = 100_000;

/// Default `kafka.transactional_id_expiration_ms` (Kafka's `transactional.id.expiration.ms`,
/// 7 days): a transactional id with no transaction under way is forgotten this long after its
/// last one, so the id table (at most `TXN_IDS_MAX`) does not fill up for ever.
pub const TXN_ID_EXPIRATION_MS_DEFAULT: i64 = 7 * 24 * 60 * 60 * 1000;

/// Bounds of `kafka.transactional_id_expiration_ms` (Kafka's minimum is 1 ms; 1 s here, the
/// timer's tick; at most 1 year).
pub const TXN_ID_EXPIRATION_MS_MIN: i64 = 1_000;
pub const TXN_ID_EXPIRATION_MS_MAX: i64 = 365 * 24 * 60 * 60 * 1000;

/// How often the transaction timer looks for transactions past their timeout.
pub const TXN_TIMER_TICK_MS: u64 = 1_000;

// ---- shard health and the watchdog (runtime/health, ops/sd_notify) ----

/// An idle shard blocked in its ring wait still turns its loop at least this often (a ring
/// TIMEOUT it keeps posted), so its heartbeat proves the loop runs, not just that it is busy.
pub const SHARD_HEARTBEAT_MS: u64 = 500;

/// A shard whose heartbeat has not moved for this long is stalled: its partitions are failed
/// and kmirror exits. Far above the heartbeat period and a loaded host's scheduling hiccups,
/// well below the unit's `WatchdogSec=30s`.
pub const SHARD_STALL_MS: u64 = 5_000;

/// How long a shard may wait on its disk (a write, an fdatasync, a log's flush before it is
/// handed back) while still counting as alive; past it the health check fails the shard (a
/// disk that takes minutes for one write is as good as gone). Under dirty-page throttling or
/// a journal commit behind gigabytes of write-back, one buffered write can take seconds: that
/// is a slow disk, not a stuck loop, and exiting for it would drop every partition's fetch.
pub const SHARD_DISK_WAIT_MAX_MS: u64 = 120_000;
const _: () = assert!(SHARD_DISK_WAIT_MAX_MS > SHARD_STALL_MS);
const _: () = assert!(SHARD_STALL_MS >= 4 * SHARD_HEARTBEAT_MS);

/// After a shard failed, kmirror keeps serving `describe` and `/metrics` this long (the FAILED
/// partitions, the unhealthy shard) before it exits non-zero for systemd to restart it.
pub const SHARD_FAILURE_EXIT_DELAY_MS: u64 = 3_000;

/// How long stopping the runtime waits for each shard thread to end; a stalled shard is left
/// behind (its logs were never handed back, so no clean-shutdown marker is written).
pub const SHARD_JOIN_WAIT_MS: u64 = 10_000;

// ---- recovery at scale (log/log_dir, recovery-point checkpoints) ----

/// Most threads opening and recovering partitions at start (`log_dir::recovery_threads`
/// takes twice the CPUs, bounded by this and the partition count).
pub const RECOVERY_THREADS_MAX: usize = 64;

/// Default period of the recovery-point checkpoint (Kafka's
/// `log.flush.offset.checkpoint.interval.ms`): every partition with new data is flushed by its
/// owner and `recovery-point-offset-checkpoint` rewritten, so a restart after kill -9
/// revalidates only what came after. Bounds of `storage.recovery_checkpoint_interval_ms`.
pub const RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT: u64 = 60_000;
pub const RECOVERY_CHECKPOINT_INTERVAL_MS_MIN: u64 = 1_000;
pub const RECOVERY_CHECKPOINT_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const _: () = assert!(
    RECOVERY_CHECKPOINT_INTERVAL_MS_MIN <= RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT
        && RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT <= RECOVERY_CHECKPOINT_INTERVAL_MS_MAX
);

/// The checkpoint file is written this long after the owners were asked to flush, so the shards'
/// flushes of this round are in it (a later one lands in the next round).
pub const RECOVERY_CHECKPOINT_WRITE_LAG_MS: u64 = 1_000;

// --- fetch.source_load (helper fetchsess): the per-mirror fetch rate cap ---

/// How far ahead of the rate a capped mirror may fetch at once (one response's worth at
/// typical caps), so the cap never stalls a mirror between two fetches it could pay for.
pub const FETCH_MAX_RATE_BURST_MS: u64 = 100;

/// Smallest cap accepted: below this a single 1 MiB partition response would hold the mirror
/// for minutes, which is a configuration mistake, not a cap.
pub const FETCH_MAX_RATE_MIN_BYTES_PER_SEC: u64 = 64 * 1024;

/// Records per batch when one command writes many keys of a keyed log at once
/// (`KeyedLog::put_many`): a few tens of KiB per batch, far below the segment size.
pub const KEYED_LOG_RECORDS_PER_BATCH_MAX: usize = 500;

// ---- descriptors held by partition logs (log/lazy_file) ----

/// Most index-file descriptors (`.index`, `.timeindex`, `.txnindex`) the process keeps open
/// between writes, over all partitions; past it an index write opens and closes its file. A
/// partition otherwise holds one descriptor (its active `.log`, once written), so kmirror needs
/// about `partitions + INDEX_FILES_HELD_MAX + FDS_FIXED_RESERVE` descriptors.
pub const INDEX_FILES_HELD_MAX: usize = 1024;

/// Descriptors besides the partitions' (sockets, rings, eventfds, checkpoints, keyed logs,
/// stdio), for the fd-budget figures in tuning/ and the systemd unit's check.
pub const FDS_FIXED_RESERVE: usize = 1024;

// ---- SASL on the Kafka endpoint and its credential store (serve/sasl, serve/credentials) ----

/// Longest user name a SASL client may send (Kafka has no bound; one keeps a hostile
/// client-first message from costing more than a frame's worth of work).
pub const SASL_USERNAME_BYTES_MAX: usize = 1024;

/// SCRAM credentials (user × mechanism) kmirror stores; an AlterUserScramCredentials past this
/// is refused. The file is rewritten whole on every change, so it stays small.
pub const SCRAM_CREDENTIALS_MAX: usize = 10_000;

/// Largest credential or PLAIN users file kmirror reads.
pub const CREDENTIAL_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// Salt bytes a client may send in an AlterUserScramCredentials upsertion (Kafka's tool sends
/// a salt of a few dozen bytes).
pub const SCRAM_SALT_BYTES_MAX: usize = 1024;

/// Kafka's `connections.max.reauth.ms` default: 0, sessions never expire.
pub const SASL_REAUTH_MS_DEFAULT: u64 = 0;

/// Shortest non-zero `connections.max.reauth.ms` accepted (clients re-authenticate at 85–95 %
/// of the lifetime, so a shorter one would have them do little else).
pub const SASL_REAUTH_MS_MIN: u64 = 1_000;

// --- ACLs (serve::authz) ---

/// Longest resource name, principal or host an ACL may hold (bytes): Kafka bounds none, but a
/// stored ACL is one keyed-log record and every request walks the set, so a bound keeps both
/// small (a topic name is at most 249 bytes).
pub const ACL_FIELD_BYTES_MAX: usize = 1024;
/// Most ACLs kmirror holds (local and synced together); CreateAcls beyond it is refused and a
/// source's list beyond it is cut (and said so in describe), so that a request's authorization
/// stays a bounded walk.
pub const ACLS_MAX: usize = 100_000;
/// Default of `mirror.acls.interval.ms`: how often a mirror's ACLs are read from its source.
pub const ACL_SYNC_INTERVAL_MS_DEFAULT: u64 = 30_000;
pub const ACL_SYNC_INTERVAL_MS_MIN: u64 = 100;
pub const ACL_SYNC_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const _: () = assert!(
    ACL_SYNC_INTERVAL_MS_MIN <= ACL_SYNC_INTERVAL_MS_DEFAULT
        && ACL_SYNC_INTERVAL_MS_DEFAULT <= ACL_SYNC_INTERVAL_MS_MAX
);
/// Most ACLs one mirror takes from its source (one `__mirror_state` record each); the rest of
/// a longer selection is left out and `describe` says so.
pub const ACL_SYNC_MIRROR_MAX: usize = 20_000;
const _: () = assert!(ACL_SYNC_MIRROR_MAX <= ACLS_MAX);

// ---- continuous integrity audit (control/audit) ----

/// Default of `mirror.audit.interval.ms`: how often a mirror's audit round runs.
pub const AUDIT_INTERVAL_MS_DEFAULT: u64 = 10_000;
pub const AUDIT_INTERVAL_MS_MIN: u64 = 100;
pub const AUDIT_INTERVAL_MS_MAX: u64 = 24 * 60 * 60 * 1000;
const _: () = assert!(
    AUDIT_INTERVAL_MS_MIN <= AUDIT_INTERVAL_MS_DEFAULT
        && AUDIT_INTERVAL_MS_DEFAULT <= AUDIT_INTERVAL_MS_MAX
);

/// Default of `mirror.audit.bytes.per.sec`: the audit's budget per mirror, for local re-reads
/// and for what it fetches again from the source each (2 MiB/s: a small fraction of a fetch
/// connection, so the source barely notices; every newly mirrored range is still verified
/// once, just later when mirroring runs faster than this).
pub const AUDIT_BYTES_PER_SEC_DEFAULT: u64 = 2 * 1024 * 1024;
/// The most a mirror's audit may read in one round, whatever the budget and interval say:
/// one round is one source worker job, and this keeps it well inside its deadline.
pub const AUDIT_ROUND_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The least share of a round's budget one partition gets: a round takes at most
/// budget / this many partitions (at least one), the rest wait for later rounds.
pub const AUDIT_PARTITION_SHARE_MIN_BYTES: u64 = 64 * 1024;
/// Mismatch and scrub events kept for `kmirror audit report` (the oldest are dropped first;
/// the counter in /metrics keeps counting).
pub const AUDIT_EVENTS_MAX: usize = 1_000;

// --- Failover loss report, consistent cut, drills (issue 16 items 2-4) ---

/// Loss reports kept per mirror (`<data_dir>/kmirror-loss-reports/<mirror>.json`): one per
/// `stop`, the oldest dropped first.
pub const LOSS_REPORTS_KEPT: usize = 100;

/// A loss-report file larger than this is refused when read (100 reports of 16,384
/// partitions at ~400 bytes each would be 650 MB: reports of huge stops are the risk).
pub const LOSS_REPORT_FILE_BYTES_MAX: u64 = 256 << 20;

/// The quarantine copies a cut log range in reads of at most this many bytes (plus one batch).
pub const QUARANTINE_READ_BYTES: u64 = 4 << 20;

/// A quarantine `report.json` larger than this is refused when read (one entry of ~200 bytes
/// per batch taken: 64 MiB is some 300,000 batches).
pub const QUARANTINE_REPORT_BYTES_MAX: u64 = 64 << 20;

/// Unclean-election recoveries `describe` lists per partition (the newest; the count and the
/// quarantined records cover all of them).
pub const UNCLEAN_RECOVERIES_SHOWN_MAX: usize = 8;

/// Longest drill topic name (`drill.<name>.<topic>`): Kafka's topic name limit.
pub const DRILL_TOPIC_NAME_MAX: usize = 249;

/// A drill or pending-cut record (`control::json_records`) larger than this is refused when
/// read: a drill of 16,384 partitions is about 4 MB of JSON.
pub const JSON_RECORD_BYTES_MAX: u64 = 64 << 20;

// --- Chained and re-pointed mirrors (issue 14 item 3, control/lineage) ---

/// `partition_max_bytes` of the re-point check's Fetch at our last batch's offset: the source
/// returns at least that one whole batch however large (KIP-74), so this only bounds what
/// comes after it.
pub const LINEAGE_PROBE_FETCH_BYTES: i32 = 64 * 1024;

/// Sources kept in a mirror's lineage (`control::lineage::Hop`); the oldest are dropped first,
/// so a mirror re-pointed back and forth keeps its record small.
pub const LINEAGE_HOPS_MAX: usize = 32;
/// Longest cluster id accepted in a source's `kmirror.lineage` (`control::lineage::chain`):
/// Kafka's are 22 characters; a longer one is not a cluster id.
pub const LINEAGE_CLUSTER_ID_CHARS_MAX: usize = 64;
/// Failback (`control::failback`): how long each call to the original may take (connect,
/// each read and write, a Produce's acks=all wait), as Kafka's `request.timeout.ms` default.
pub const FAILBACK_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Between two attempts to commit a group's offsets on the original while its coordinator is
/// not available yet (a cluster creates `__consumer_offsets` for its first group).
pub const FAILBACK_COORDINATOR_RETRY_MS: u64 = 200;
/// Bytes one Fetch of the divergent tail scan asks for.
pub const FAILBACK_FETCH_BYTES: u64 = 1024 * 1024;
/// At most this much of the divergent tail is read to count its records and time range;
/// past it the report says the scan is incomplete (its offset count stays exact).
pub const FAILBACK_TAIL_SCAN_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// Batches copied from one partition before the copier turns to the next.
pub const FAILBACK_BATCHES_PER_TURN: usize = 64;
/// How long the copier sleeps when every partition is copied to kmirror's end.
pub const FAILBACK_IDLE_POLL_MS: u64 = 100;
/// The longest backoff between the copier's sessions with the original.
pub const FAILBACK_RETRY_BACKOFF_MS_MAX: u64 = 5_000;
/// The transaction timeout failback asks the original for its replayed transactions: Kafka's
/// default `transaction.max.timeout.ms` (15 min), the longest a replayed transaction may stay
/// open (kmirror down, or a later transaction on kmirror holding the copy below its LSO).
pub const FAILBACK_TXN_TIMEOUT_MS: i32 = 900_000;
/// The largest failback state file read back (one range per batch at worst).
pub const FAILBACK_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// How long `failback create` may take (list, scan) and `failback stop` waits for the
/// copier to catch up and move the groups, by default.
pub const FAILBACK_CREATE_TIMEOUT_MS: u64 = 120_000;
pub const FAILBACK_STOP_TIMEOUT_MS_DEFAULT: u64 = 60_000;
