// Reads kmirror-written files with Apache Kafka's own classes and prints what Kafka sees, so the
// Rust tests (tests/log_formats_kafka.rs) can compare it with the values they wrote. Run as a
// single-file program: java -cp "<kafka libs>/*" tests/kafka/FormatProbe.java <script>
// Each script line is one command; each output line starts with the command's name.
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.ControlRecordType;
import org.apache.kafka.common.record.EndTransactionMarker;
import org.apache.kafka.common.record.MemoryRecords;
import org.apache.kafka.common.record.RecordBatch;
import org.apache.kafka.common.record.SimpleRecord;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.checkpoint.CleanShutdownFileHandler;
import org.apache.kafka.storage.internals.checkpoint.LeaderEpochCheckpointFile;
import org.apache.kafka.storage.internals.checkpoint.OffsetCheckpointFile;
import org.apache.kafka.storage.internals.checkpoint.PartitionMetadataFile;
import org.apache.kafka.storage.internals.epoch.LeaderEpochFileCache;
import org.apache.kafka.storage.internals.log.AbortedTxn;
import org.apache.kafka.storage.internals.log.EpochEntry;
import org.apache.kafka.storage.internals.log.LogDirFailureChannel;
import org.apache.kafka.storage.internals.log.ProducerStateEntry;
import org.apache.kafka.storage.internals.log.ProducerStateManager;
import org.apache.kafka.storage.internals.log.ProducerStateManagerConfig;
import org.apache.kafka.storage.internals.log.TransactionIndex;
import org.apache.kafka.storage.internals.log.TxnIndexSearchResult;

public class FormatProbe {
    static final TopicPartition TP = new TopicPartition("probe", 0);

    public static void main(String[] args) throws Exception {
        KafkaScheduler scheduler = new KafkaScheduler(1);
        scheduler.startup();
        LeaderEpochFileCache cache = null;
        try {
            for (String line : Files.readAllLines(new File(args[0]).toPath())) {
                String[] a = line.trim().split("\\s+");
                switch (a[0]) {
                    case "epoch-read": {
                        LeaderEpochCheckpointFile f = new LeaderEpochCheckpointFile(new File(a[1]), new LogDirFailureChannel(1));
                        for (EpochEntry e : f.read()) System.out.println("epoch-read " + e.epoch + " " + e.startOffset);
                        break;
                    }
                    case "epoch-new":
                        cache = new LeaderEpochFileCache(TP, new LeaderEpochCheckpointFile(new File(a[1]), new LogDirFailureChannel(1)), scheduler);
                        break;
                    case "epoch-assign":
                        cache.assign(Integer.parseInt(a[1]), Long.parseLong(a[2]));
                        break;
                    case "epoch-truncate-end":
                        cache.truncateFromEndAsyncFlush(Long.parseLong(a[1]));
                        break;
                    case "epoch-truncate-start":
                        cache.truncateFromStartAsyncFlush(Long.parseLong(a[1]));
                        break;
                    case "epoch-end-offset": {
                        Map.Entry<Integer, Long> r = cache.endOffsetFor(Integer.parseInt(a[1]), Long.parseLong(a[2]));
                        System.out.println("epoch-end-offset " + r.getKey() + " " + r.getValue());
                        break;
                    }
                    case "epoch-entries": {
                        StringBuilder sb = new StringBuilder("epoch-entries");
                        for (EpochEntry e : cache.epochEntries()) sb.append(' ').append(e.epoch).append(':').append(e.startOffset);
                        System.out.println(sb);
                        break;
                    }
                    case "partition-meta":
                        System.out.println("partition-meta " + new PartitionMetadataFile(new File(a[1]), new LogDirFailureChannel(1)).read().topicId());
                        break;
                    case "offsets": {
                        Map<TopicPartition, Long> m = new OffsetCheckpointFile(new File(a[1]), new LogDirFailureChannel(1)).read();
                        for (Map.Entry<TopicPartition, Long> e : m.entrySet())
                            System.out.println("offsets " + e.getKey().topic() + " " + e.getKey().partition() + " " + e.getValue());
                        break;
                    }
                    case "clean-shutdown": {
                        CleanShutdownFileHandler h = new CleanShutdownFileHandler(a[1]);
                        System.out.println("clean-shutdown " + h.exists() + " " + h.read());
                        break;
                    }
                    case "end-txn-marker": {
                        // offset timestamp leaderEpoch producerId producerEpoch ABORT|COMMIT coordinatorEpoch
                        EndTransactionMarker m = new EndTransactionMarker(ControlRecordType.valueOf(a[6]), Integer.parseInt(a[7]));
                        MemoryRecords r = MemoryRecords.withEndTransactionMarker(Long.parseLong(a[1]), Long.parseLong(a[2]),
                            Integer.parseInt(a[3]), Long.parseLong(a[4]), Short.parseShort(a[5]), m);
                        System.out.println("end-txn-marker " + hex(r.buffer()));
                        break;
                    }
                    case "data-batch": {
                        // offset leaderEpoch producerId producerEpoch baseSequence transactional then
                        // records as timestamp,key|-,value|-[,headerKey=headerValue]
                        List<SimpleRecord> recs = new ArrayList<>();
                        for (int i = 7; i < a.length; i++) {
                            String[] f = a[i].split(",");
                            Header[] hs = new Header[f.length - 3];
                            for (int h = 3; h < f.length; h++) {
                                String[] kv = f[h].split("=", 2);
                                hs[h - 3] = new RecordHeader(kv[0], kv[1].equals("-") ? null : bytes(kv[1]));
                            }
                            recs.add(new SimpleRecord(Long.parseLong(f[0]), f[1].equals("-") ? null : bytes(f[1]),
                                f[2].equals("-") ? null : bytes(f[2]), hs));
                        }
                        MemoryRecords r = MemoryRecords.withRecords(RecordBatch.MAGIC_VALUE_V2, Long.parseLong(a[1]), Compression.NONE,
                            TimestampType.CREATE_TIME, Long.parseLong(a[3]), Short.parseShort(a[4]), Integer.parseInt(a[5]),
                            Integer.parseInt(a[2]), Boolean.parseBoolean(a[6]), recs.toArray(new SimpleRecord[0]));
                        System.out.println("data-batch " + hex(r.buffer()));
                        break;
                    }
                    case "txn-collect": {
                        // file baseOffset fetchOffset upperBound
                        TransactionIndex idx = new TransactionIndex(Long.parseLong(a[2]), new File(a[1]));
                        idx.sanityCheck();
                        TxnIndexSearchResult r = idx.collectAbortedTxns(Long.parseLong(a[3]), Long.parseLong(a[4]));
                        StringBuilder sb = new StringBuilder("txn-collect " + r.isComplete);
                        for (AbortedTxn t : r.abortedTransactions)
                            sb.append(' ').append(t.producerId()).append(':').append(t.firstOffset()).append(':')
                              .append(t.lastOffset()).append(':').append(t.lastStableOffset());
                        System.out.println(sb);
                        idx.close();
                        break;
                    }
                    case "producer-state": {
                        // dir logStartOffset logEndOffset nowMs: load the way a broker does at startup
                        ProducerStateManager psm = new ProducerStateManager(TP, new File(a[1]), 900000,
                            new ProducerStateManagerConfig(86400000, false), Time.SYSTEM);
                        psm.truncateAndReload(Long.parseLong(a[2]), Long.parseLong(a[3]), Long.parseLong(a[4]));
                        System.out.println("producer-state mapEndOffset " + psm.mapEndOffset());
                        System.out.println("producer-state firstUnstableOffset "
                            + psm.firstUnstableOffset().map(o -> Long.toString(o.messageOffset)).orElse("none"));
                        for (Map.Entry<Long, ProducerStateEntry> e : new TreeMap<>(psm.activeProducers()).entrySet()) {
                            ProducerStateEntry p = e.getValue();
                            System.out.println("producer-state producer " + e.getKey() + " " + p.producerEpoch() + " "
                                + p.lastSeq() + " " + p.lastDataOffset() + " " + p.lastOffsetDelta() + " " + p.lastTimestamp()
                                + " " + p.coordinatorEpoch() + " " + (p.currentTxnFirstOffset().isPresent() ? p.currentTxnFirstOffset().getAsLong() : -1));
                        }
                        break;
                    }
                    default:
                        throw new IllegalArgumentException("unknown probe command: " + line);
                }
            }
        } finally {
            scheduler.shutdown();
        }
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String hex(ByteBuffer b) {
        StringBuilder sb = new StringBuilder();
        ByteBuffer d = b.duplicate();
        while (d.hasRemaining()) sb.append(String.format("%02x", d.get()));
        return sb.toString();
    }
}
