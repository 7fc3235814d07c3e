// A small command-line client for the kmirror test harness. It drives a real broker with the real
// Java clients (Admin, Producer, Consumer), so tests check kmirror against what Kafka itself
// writes. Output is one JSON object per line on stdout; errors go to stderr with exit code 1.
//
//   create-topic  --bootstrap B --topic T --partitions N [--config k=v]...
//   produce       --bootstrap B --topic T --partition P [--spread N] --count N [--codec none|gzip|snappy|lz4|zstd]
//                 [--idempotent] [--txns commit,abort,...|open] [--txn-id ID] [--txn-timeout-ms MS]
//                 [--batch-size BYTES] [--linger-ms MS] [--seed S] [--value-bytes N] [--headers N]
//   consume       --bootstrap B --topic T --partition P --from OFFSET --max N
//                 [--isolation read_committed|read_uncommitted] [--timeout-ms MS]
//                 [--client-properties FILE]: more consumer settings (security.protocol, ssl.*)
//                 [--until-end true]: stop once the position reaches the end offset (the last
//                 stable offset under read_committed) instead of waiting for more; failing to
//                 get there within the timeout is an error
//   offsets       --bootstrap B --topic T --partition P
//   offsets-for-times --bootstrap B --topic T --partition P --timestamps T1,T2,...
//                 (one line per timestamp, then one for the max timestamp)
//   describe-configs --bootstrap B --topic T --keys k1,k2,...   (one line per key: value or null,
//                 and the ConfigEntry source, e.g. DYNAMIC_TOPIC_CONFIG)
//   delete-records --bootstrap B --topic T --partition P --before OFFSET
//   alter-config  --bootstrap B --topic T --set k=v...
//   group-consume --bootstrap B --topic T --group G --max N [--timeout-ms MS] [--commit-epoch E]
//                 [--group-protocol classic|consumer]
//                 subscribes as a member of G, consumes N records, commits exactly what it consumed
//                 (commitSync), prints one {"partition","offset"} line per record and leaves;
//                 `consumer` is KIP-848's protocol (ConsumerGroupHeartbeat), default `classic`
//   group-member  --bootstrap B --topic T --group G
//                 subscribes as a member of G until its stdin closes, prints {"assigned":[p...]}
//                 after each rebalance and {"record":{"partition","offset"}} per record, then
//                 leaves
//   txn-transform --bootstrap B --topic IN --group G --out OUT --txns commit,abort,... --per-txn N
//                 [--txn-id ID] [--resume-file F]
//                 consume-transform-produce: a read_committed member of G reads IN; per listed
//                 outcome one transaction writes the next N records, values reversed, to OUT
//                 partition 0, sends the consumed offsets with sendOffsetsToTransaction and
//                 commits or aborts; prints {"txn","partition","next","produced":[...]} per
//                 transaction. Outcome `hold` prints {"held":true} once its offsets are sent,
//                 waits for the file F to exist, then commits.
//
// Every command takes [--command-config FILE]: client properties (security settings) loaded
// before the command's own.
//
//   session       runs many commands in this one JVM (a JVM start per client check costs
//                 seconds on a loaded machine): each stdin line is one command, its arguments
//                 base64-encoded and joined by spaces; each answer is one stdout line
//                 "<exit status> <base64 of its stdout> <base64 of its stderr>", the status and
//                 stderr as the command's own JVM would have given (an exception's stack trace,
//                 status 1). It ends at the end of stdin. Not for commands that halt the JVM
//                 (`produce --txns ...,open`) or wait on stdin (`group-member`).
//
// `produce --txns` splits the records evenly over one transaction per listed outcome. The outcome
// `open` leaves the last transaction open: the tool flushes, prints its result and halts the JVM
// without aborting, as a crashed producer would.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaTool {
    public static void main(String[] argv) throws Exception {
        if (argv.length == 0) {
            throw new IllegalArgumentException("usage: KafkaTool <command> [--flag value]...");
        }
        if (argv[0].equals("session")) {
            session();
            return;
        }
        run(argv);
    }

    static void run(String[] argv) throws Exception {
        Args a = new Args(argv);
        switch (argv[0]) {
            case "create-topic" -> createTopic(a);
            case "produce" -> produce(a);
            case "consume" -> consume(a);
            case "offsets" -> offsets(a);
            case "offsets-for-times" -> offsetsForTimes(a);
            case "describe-configs" -> describeConfigs(a);
            case "delete-records" -> deleteRecords(a);
            case "alter-config" -> alterConfig(a);
            case "group-consume" -> groupConsume(a);
            case "group-member" -> groupMember(a);
            case "txn-transform" -> txnTransform(a);
            case "delete-topic" -> deleteTopic(a);
            default -> throw new IllegalArgumentException("unknown command " + argv[0]);
        }
    }

    static void session() throws Exception {
        java.nio.charset.Charset utf8 = java.nio.charset.StandardCharsets.UTF_8;
        java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in, utf8));
        java.io.PrintStream realOut = System.out;
        java.io.PrintStream realErr = System.err;
        Base64.Decoder dec = Base64.getDecoder();
        Base64.Encoder enc = Base64.getEncoder();
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.trim().split(" ");
            String[] argv = new String[parts.length];
            for (int i = 0; i < parts.length; i++) argv[i] = new String(dec.decode(parts[i]), utf8);
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
            java.io.ByteArrayOutputStream err = new java.io.ByteArrayOutputStream();
            java.io.PrintStream po = new java.io.PrintStream(out, true, utf8);
            java.io.PrintStream pe = new java.io.PrintStream(err, true, utf8);
            System.setOut(po);
            System.setErr(pe);
            int status = 0;
            try {
                if (argv[0].equals("session")) throw new IllegalArgumentException("session in a session");
                run(argv);
            } catch (Throwable t) {
                // As the JVM reports an uncaught exception of main.
                pe.print("Exception in thread \"main\" ");
                t.printStackTrace(pe);
                status = 1;
            } finally {
                po.flush();
                pe.flush();
                System.setOut(realOut);
                System.setErr(realErr);
            }
            realOut.println(status + " " + enc.encodeToString(out.toByteArray()) + " "
                    + enc.encodeToString(err.toByteArray()));
            realOut.flush();
        }
    }

    // Every client starts from `--command-config FILE` when given (security.protocol,
    // sasl.mechanism, sasl.jaas.config, ... as Kafka's own tools take them).
    static Properties props(Args a) {
        Properties p = new Properties();
        String file = a.get("command-config", null);
        if (file != null) {
            try (java.io.FileInputStream in = new java.io.FileInputStream(file)) {
                p.load(in);
            } catch (java.io.IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        }
        return p;
    }

    static Admin admin(Args a) {
        Properties p = props(a);
        p.put("bootstrap.servers", a.get("bootstrap"));
        p.put("request.timeout.ms", "20000");
        p.put("default.api.timeout.ms", "60000");
        return Admin.create(p);
    }

    static void createTopic(Args a) throws Exception {
        String topic = a.get("topic");
        int partitions = Integer.parseInt(a.get("partitions", "1"));
        Map<String, String> configs = new HashMap<>();
        for (String kv : a.all("config")) {
            int eq = kv.indexOf('=');
            configs.put(kv.substring(0, eq), kv.substring(eq + 1));
        }
        try (Admin admin = admin(a)) {
            NewTopic t = new NewTopic(topic, partitions, (short) 1).configs(configs);
            admin.createTopics(List.of(t)).all().get(60, TimeUnit.SECONDS);
            // Creation returns before every partition has a leader; producers would then retry
            // and reorder nothing, but tests read partition directories right away.
            long deadline = System.currentTimeMillis() + 30_000;
            while (true) {
                TopicDescription d;
                try {
                    d = admin.describeTopics(List.of(topic)).allTopicNames()
                            .get(30, TimeUnit.SECONDS).get(topic);
                } catch (java.util.concurrent.ExecutionException e) {
                    // The broker answers metadata from its own image, which may not hold the
                    // topic yet right after the controller created it.
                    if (!(e.getCause() instanceof
                            org.apache.kafka.common.errors.UnknownTopicOrPartitionException)
                            || System.currentTimeMillis() > deadline) {
                        throw e;
                    }
                    Thread.sleep(50);
                    continue;
                }
                boolean ready = d.partitions().size() == partitions;
                for (TopicPartitionInfo pi : d.partitions()) {
                    ready &= pi.leader() != null && !pi.leader().isEmpty();
                }
                if (ready) break;
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("topic " + topic + " has no leaders: " + d);
                }
                Thread.sleep(50);
            }
        }
        System.out.println("{\"topic\":\"" + topic + "\",\"partitions\":" + partitions + "}");
    }

    static void produce(Args a) throws Exception {
        String topic = a.get("topic");
        int partition = Integer.parseInt(a.get("partition", "0"));
        // --spread N: record i goes to partition i % N (one JVM fills many partitions).
        int spread = Integer.parseInt(a.get("spread", "0"));
        int count = Integer.parseInt(a.get("count"));
        long seed = Long.parseLong(a.get("seed", "1"));
        int valueBytes = Integer.parseInt(a.get("value-bytes", "100"));
        int headers = Integer.parseInt(a.get("headers", "0"));
        String[] txns = a.has("txns") ? a.get("txns").split(",") : new String[0];

        Properties p = props(a);
        p.put("bootstrap.servers", a.get("bootstrap"));
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("compression.type", a.get("codec", "none"));
        p.put("batch.size", a.get("batch-size", "16384"));
        p.put("linger.ms", a.get("linger-ms", "5"));
        p.put("acks", "all");
        boolean idempotent = a.has("idempotent") || txns.length > 0;
        p.put("enable.idempotence", Boolean.toString(idempotent));
        if (!idempotent) {
            p.put("max.in.flight.requests.per.connection", "1");
            p.put("retries", "0");
        }
        if (txns.length > 0) {
            p.put("transactional.id", a.get("txn-id", "kmirror-test-" + topic + "-" + seed));
            p.put("transaction.timeout.ms", a.get("txn-timeout-ms", "60000"));
        }

        Random rnd = new Random(seed);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
        if (txns.length > 0) producer.initTransactions();
        int rounds = Math.max(1, txns.length);
        int done = 0;
        boolean leftOpen = false;
        for (int r = 0; r < rounds; r++) {
            int n = (count - done) / (rounds - r);
            if (txns.length > 0) producer.beginTransaction();
            for (int i = 0; i < n; i++, done++) {
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(
                        topic, spread > 0 ? done % spread : partition, key(seed, done),
                        value(rnd, valueBytes));
                for (int h = 0; h < headers; h++) {
                    rec.headers().add("h" + h, ("v" + h + "-" + done).getBytes());
                }
                sent.add(producer.send(rec));
            }
            if (txns.length == 0) continue;
            switch (txns[r]) {
                case "commit" -> producer.commitTransaction();
                case "abort" -> {
                    producer.flush();
                    producer.abortTransaction();
                }
                case "open" -> {
                    producer.flush();
                    leftOpen = true;
                }
                default -> throw new IllegalArgumentException("txn outcome " + txns[r]);
            }
            if (leftOpen) break;
        }
        producer.flush();
        long first = -1, last = -1;
        StringBuilder offsets = new StringBuilder();
        for (Future<RecordMetadata> f : sent) {
            long off = f.get(60, TimeUnit.SECONDS).offset();
            if (first < 0) first = off;
            last = off;
            if (offsets.length() > 0) offsets.append(',');
            offsets.append(off);
        }
        System.out.println("{\"count\":" + sent.size() + ",\"first_offset\":" + first
                + ",\"last_offset\":" + last + ",\"offsets\":[" + offsets + "]}");
        System.out.flush();
        if (leftOpen) {
            // Halting skips close(), so the broker keeps the transaction open until it times out.
            Runtime.getRuntime().halt(0);
        }
        producer.close(Duration.ofSeconds(30));
    }

    static byte[] key(long seed, int i) {
        return ("key-" + seed + "-" + i).getBytes();
    }

    // Text that compresses somewhat but not to nothing: random words from a small alphabet.
    static byte[] value(Random rnd, int n) {
        byte[] v = new byte[n];
        for (int i = 0; i < n; i++) v[i] = (byte) ('a' + rnd.nextInt(8));
        return v;
    }

    static void consume(Args a) throws Exception {
        TopicPartition tp = new TopicPartition(a.get("topic"), Integer.parseInt(a.get("partition", "0")));
        int max = Integer.parseInt(a.get("max"));
        long timeoutMs = Long.parseLong(a.get("timeout-ms", "30000"));
        Properties p = props(a);
        p.put("bootstrap.servers", a.get("bootstrap"));
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("isolation.level", a.get("isolation", "read_uncommitted"));
        if (a.has("client-properties")) {
            try (var in = new java.io.FileInputStream(a.get("client-properties"))) {
                p.load(in);
            }
        }
        Base64.Encoder b64 = Base64.getEncoder();
        int got = 0;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.assign(List.of(tp));
            c.seek(tp, Long.parseLong(a.get("from", "0")));
            boolean untilEnd = Boolean.parseBoolean(a.get("until-end", "false"));
            long end = untilEnd ? c.endOffsets(List.of(tp)).get(tp) : Long.MAX_VALUE;
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (got < max && System.currentTimeMillis() < deadline) {
                if (untilEnd && c.position(tp) >= end) break;
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    if (got == max) break;
                    StringBuilder hs = new StringBuilder();
                    for (Header h : r.headers()) {
                        if (hs.length() > 0) hs.append(',');
                        hs.append("[\"").append(h.key()).append("\",\"")
                                .append(b64.encodeToString(h.value())).append("\"]");
                    }
                    System.out.println("{\"offset\":" + r.offset() + ",\"timestamp\":" + r.timestamp()
                            + ",\"key\":" + b64OrNull(b64, r.key()) + ",\"value\":"
                            + b64OrNull(b64, r.value()) + ",\"headers\":[" + hs + "]}");
                    got++;
                }
            }
            if (untilEnd && got < max && c.position(tp) < end) {
                throw new IllegalStateException("position " + c.position(tp) + " did not reach the end "
                        + end + " of " + tp + " within " + timeoutMs + " ms");
            }
        }
    }

    static Properties groupProps(Args a) {
        Properties p = props(a);
        p.put("bootstrap.servers", a.get("bootstrap"));
        p.put("group.id", a.get("group"));
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        String protocol = a.get("group-protocol", "classic");
        p.put("group.protocol", protocol);
        if (protocol.equals("classic")) {
            // The consumer protocol (KIP-848) refuses these: the coordinator sets them.
            p.put("session.timeout.ms", "10000");
            p.put("heartbeat.interval.ms", "1000");
        }
        p.put("max.poll.interval.ms", "60000");
        return p;
    }

    static void groupConsume(Args a) throws Exception {
        int max = Integer.parseInt(a.get("max"));
        long timeoutMs = Long.parseLong(a.get("timeout-ms", "60000"));
        // --commit-epoch E commits with leader epoch E instead of the last record's (what a
        // client committing the leader's current epoch sends; the API allows any epoch).
        String commitEpoch = a.get("commit-epoch", "");
        Map<TopicPartition, org.apache.kafka.clients.consumer.OffsetAndMetadata> next = new HashMap<>();
        int got = 0;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(groupProps(a))) {
            c.subscribe(List.of(a.get("topic")));
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (got < max && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    if (got == max) break;
                    System.out.println("{\"partition\":" + r.partition() + ",\"offset\":" + r.offset() + "}");
                    next.put(new TopicPartition(r.topic(), r.partition()),
                            new org.apache.kafka.clients.consumer.OffsetAndMetadata(r.offset() + 1,
                                    commitEpoch.isEmpty() ? r.leaderEpoch()
                                            : Optional.of(Integer.parseInt(commitEpoch)), ""));
                    got++;
                }
            }
            c.commitSync(next);
        }
        if (got < max) throw new IllegalStateException("consumed " + got + " of " + max);
    }

    static void groupMember(Args a) throws Exception {
        // The test decides when this member leaves (after it saw the assignments it waits
        // for), so no step depends on how fast a JVM starts.
        java.util.concurrent.atomic.AtomicBoolean leave = new java.util.concurrent.atomic.AtomicBoolean();
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() != -1) { }
            } catch (java.io.IOException e) {
                // A broken stdin means the test is gone: leave as well.
            }
            leave.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(groupProps(a))) {
            c.subscribe(List.of(a.get("topic")), new org.apache.kafka.clients.consumer.ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {}
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    List<Integer> ps = new ArrayList<>();
                    for (TopicPartition tp : c.assignment()) ps.add(tp.partition());
                    java.util.Collections.sort(ps);
                    System.out.println("{\"assigned\":" + ps + "}");
                    System.out.flush();
                }
            });
            while (!leave.get()) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println("{\"record\":{\"partition\":" + r.partition() + ",\"offset\":" + r.offset() + "}}");
                }
                System.out.flush();
            }
        }
    }

    static void txnTransform(Args a) throws Exception {
        String out = a.get("out");
        int perTxn = Integer.parseInt(a.get("per-txn"));
        String[] txns = a.get("txns").split(",");
        Properties cp = groupProps(a);
        cp.put("isolation.level", "read_committed");
        Properties pp = props(a);
        pp.put("bootstrap.servers", a.get("bootstrap"));
        pp.put("key.serializer", ByteArraySerializer.class.getName());
        pp.put("value.serializer", ByteArraySerializer.class.getName());
        pp.put("transactional.id", a.get("txn-id", "kmirror-transform-" + a.get("group")));
        pp.put("transaction.timeout.ms", "60000");
        java.util.ArrayDeque<ConsumerRecord<byte[], byte[]>> buffered = new java.util.ArrayDeque<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp);
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            c.subscribe(List.of(a.get("topic")));
            producer.initTransactions();
            for (String outcome : txns) {
                long deadline = System.currentTimeMillis() + 60000;
                while (buffered.size() < perTxn) {
                    if (System.currentTimeMillis() > deadline) {
                        throw new IllegalStateException("consumed " + buffered.size() + " of " + perTxn);
                    }
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) buffered.add(r);
                }
                producer.beginTransaction();
                Map<TopicPartition, org.apache.kafka.clients.consumer.OffsetAndMetadata> next = new HashMap<>();
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (int i = 0; i < perTxn; i++) {
                    ConsumerRecord<byte[], byte[]> r = buffered.poll();
                    byte[] v = r.value().clone();
                    for (int x = 0, y = v.length - 1; x < y; x++, y--) {
                        byte t = v[x]; v[x] = v[y]; v[y] = t;
                    }
                    sent.add(producer.send(new ProducerRecord<>(out, 0, r.key(), v)));
                    next.put(new TopicPartition(r.topic(), r.partition()),
                            new org.apache.kafka.clients.consumer.OffsetAndMetadata(r.offset() + 1,
                                    r.leaderEpoch(), ""));
                }
                producer.sendOffsetsToTransaction(next, c.groupMetadata());
                switch (outcome) {
                    case "commit" -> producer.commitTransaction();
                    case "hold" -> {
                        // Everything is sent and the offsets are with the coordinator; the
                        // caller may restart it now. Commit once --resume-file exists.
                        producer.flush();
                        System.out.println("{\"held\":true}");
                        System.out.flush();
                        java.nio.file.Path resume = java.nio.file.Path.of(a.get("resume-file"));
                        long until = System.currentTimeMillis() + 120000;
                        while (!java.nio.file.Files.exists(resume)) {
                            if (System.currentTimeMillis() > until) throw new IllegalStateException("no " + resume);
                            Thread.sleep(50);
                        }
                        producer.commitTransaction();
                    }
                    case "abort" -> {
                        producer.flush();
                        producer.abortTransaction();
                    }
                    default -> throw new IllegalArgumentException("txn outcome " + outcome);
                }
                StringBuilder offs = new StringBuilder();
                for (Future<RecordMetadata> f : sent) {
                    if (offs.length() > 0) offs.append(',');
                    offs.append(f.get(60, TimeUnit.SECONDS).offset());
                }
                for (Map.Entry<TopicPartition, org.apache.kafka.clients.consumer.OffsetAndMetadata> e : next.entrySet()) {
                    System.out.println("{\"txn\":\"" + outcome + "\",\"partition\":" + e.getKey().partition()
                            + ",\"next\":" + e.getValue().offset() + ",\"produced\":[" + offs + "]}");
                }
                System.out.flush();
            }
        }
    }

    static String b64OrNull(Base64.Encoder b64, byte[] b) {
        return b == null ? "null" : "\"" + b64.encodeToString(b) + "\"";
    }

    static void offsets(Args a) throws Exception {
        TopicPartition tp = new TopicPartition(a.get("topic"), Integer.parseInt(a.get("partition", "0")));
        try (Admin admin = admin(a)) {
            ListOffsetsResult.ListOffsetsResultInfo start = admin
                    .listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get();
            ListOffsetsResult.ListOffsetsResultInfo end = admin
                    .listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get();
            System.out.println("{\"log_start_offset\":" + start.offset() + ",\"log_end_offset\":"
                    + end.offset() + "}");
        }
    }

    static void offsetsForTimes(Args a) throws Exception {
        TopicPartition tp = new TopicPartition(a.get("topic"), Integer.parseInt(a.get("partition", "0")));
        try (Admin admin = admin(a)) {
            List<OffsetSpec> specs = new ArrayList<>();
            List<String> names = new ArrayList<>();
            for (String t : a.get("timestamps").split(",")) {
                specs.add(OffsetSpec.forTimestamp(Long.parseLong(t)));
                names.add(t);
            }
            specs.add(OffsetSpec.maxTimestamp());
            names.add("\"max\"");
            for (int i = 0; i < specs.size(); i++) {
                ListOffsetsResult.ListOffsetsResultInfo r = admin
                        .listOffsets(Map.of(tp, specs.get(i))).partitionResult(tp).get();
                System.out.println("{\"query\":" + names.get(i) + ",\"offset\":" + r.offset()
                        + ",\"timestamp\":" + r.timestamp() + "}");
            }
        }
    }

    static void describeConfigs(Args a) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, a.get("topic"));
        try (Admin admin = admin(a)) {
            org.apache.kafka.clients.admin.Config c = admin.describeConfigs(List.of(res))
                    .values().get(res).get(60, TimeUnit.SECONDS);
            for (String key : a.get("keys").split(",")) {
                ConfigEntry e = c.get(key);
                String v = e == null || e.value() == null ? "null" : "\"" + e.value() + "\"";
                String src = e == null ? "null" : "\"" + e.source().name() + "\"";
                System.out.println("{\"key\":\"" + key + "\",\"value\":" + v
                        + ",\"source\":" + src + "}");
            }
        }
    }

    static void deleteRecords(Args a) throws Exception {
        TopicPartition tp = new TopicPartition(a.get("topic"), Integer.parseInt(a.get("partition", "0")));
        long before = Long.parseLong(a.get("before"));
        try (Admin admin = admin(a)) {
            long low = admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(before)))
                    .lowWatermarks().get(tp).get(60, TimeUnit.SECONDS).lowWatermark();
            System.out.println("{\"low_watermark\":" + low + "}");
        }
    }

    /** Deletes a topic and waits until its name is free again (deletion is asynchronous). */
    static void deleteTopic(Args a) throws Exception {
        String topic = a.get("topic");
        try (Admin admin = admin(a)) {
            admin.deleteTopics(List.of(topic)).all().get(60, TimeUnit.SECONDS);
            long deadline = System.currentTimeMillis() + 60_000;
            while (admin.listTopics().names().get(30, TimeUnit.SECONDS).contains(topic)) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("topic " + topic + " still listed");
                }
                Thread.sleep(100);
            }
        }
        System.out.println("{\"deleted\":\"" + topic + "\"}");
    }

    static void alterConfig(Args a) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, a.get("topic"));
        Collection<AlterConfigOp> ops = new ArrayList<>();
        for (String kv : a.all("set")) {
            int eq = kv.indexOf('=');
            ops.add(new AlterConfigOp(new ConfigEntry(kv.substring(0, eq), kv.substring(eq + 1)),
                    AlterConfigOp.OpType.SET));
        }
        try (Admin admin = admin(a)) {
            admin.incrementalAlterConfigs(Map.of(res, ops)).all().get(60, TimeUnit.SECONDS);
        }
        System.out.println("{\"altered\":" + ops.size() + "}");
    }

    // `--name value` pairs; a flag followed by another flag (or nothing) is a boolean switch.
    static final class Args {
        private final Map<String, List<String>> values = new HashMap<>();

        Args(String[] argv) {
            for (int i = 1; i < argv.length; i++) {
                if (!argv[i].startsWith("--")) {
                    throw new IllegalArgumentException("expected --flag, got " + argv[i]);
                }
                String name = argv[i].substring(2);
                String value = "true";
                if (i + 1 < argv.length && !argv[i + 1].startsWith("--")) value = argv[++i];
                values.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
            }
        }

        boolean has(String name) {
            return values.containsKey(name);
        }

        String get(String name) {
            if (!has(name)) throw new IllegalArgumentException("missing --" + name);
            return values.get(name).get(0);
        }

        String get(String name, String dflt) {
            return has(name) ? values.get(name).get(0) : dflt;
        }

        List<String> all(String name) {
            return values.getOrDefault(name, List.of());
        }
    }
}
