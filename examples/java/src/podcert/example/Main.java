package podcert.example;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.cert.CertificateException;
import java.security.cert.X509Certificate;
import java.util.ArrayList;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import javax.net.ssl.KeyManager;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLServerSocket;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.SSLSession;
import javax.net.ssl.TrustManager;

/**
 * A Java workload on podcert's credentials, with the JDK alone: an SSLContext whose key and
 * trust managers read a SPIFFE Filesystem Delivery credential folder on every handshake and
 * authorize the peer's SPIFFE ID inside it.
 *
 * <pre>
 * java -cp CLASSES podcert.example.Main server --folder DIR --listen 127.0.0.1:8443 --peer-id spiffe://td/ns/shop/sa/web
 * java -cp CLASSES podcert.example.Main client --folder DIR --url https://127.0.0.1:8443/ --peer-id spiffe://td/ns/shop/sa/api
 * </pre>
 *
 * <p>The server answers {@code GET /} as podcert's Python example server does ({@code caller},
 * {@code caller_serial}, {@code server_serial}) and drains connections made with a credential
 * since rotated (their next answer carries {@code Connection: close}). The client makes one
 * connection per request, at {@code --rate} per second for {@code --duration} seconds, or
 * {@code --requests} calls, or until SIGTERM, and exits 1 if any call failed. Output: one JSON
 * object per line on stdout, events as they happen, then a summary.
 */
public final class Main {
    private static final PrintStream OUT = System.out;
    private static final int TIMEOUT_MS = 10_000;
    private static final int MAX_HEAD_BYTES = 16 * 1024;

    public static void main(String[] argv) throws Exception {
        // Stateless TLS 1.3 tickets would let a client resume without a handshake the managers
        // see; with them off, the server's sessions live in its cache, where invalidate works.
        System.setProperty("jdk.tls.server.enableSessionTicketExtension", "false");
        if (argv.length < 1 || !(argv[0].equals("server") || argv[0].equals("client"))) {
            System.err.println("usage: podcert.example.Main server|client --folder DIR --peer-id ID "
                    + "[--peer-trust-domain TD] (server: --listen HOST:PORT; client: --url URL "
                    + "[--rate N] [--duration S] [--requests N])");
            System.exit(2);
        }
        Options options;
        try {
            options = Options.parse(argv);
        } catch (IllegalArgumentException e) {
            System.err.println("spiffe-mtls: " + e.getMessage());
            System.exit(2);
            return;
        }
        int status;
        try {
            status = argv[0].equals("server") ? server(options) : client(options);
        } catch (IOException | GeneralSecurityException e) {
            System.err.println("spiffe-mtls: " + e.getMessage());
            status = 1;
        } catch (IllegalArgumentException e) {
            System.err.println("spiffe-mtls: " + e.getMessage());
            status = 2;
        }
        OUT.flush();
        // halt, not exit: after SIGTERM the JVM is already shutting down, and exit would wait
        // for the shutdown hook that is waiting for us.
        Runtime.getRuntime().halt(status);
    }

    // --- options ---------------------------------------------------------------------------

    record Options(Map<String, List<String>> values) {
        static final Set<String> KNOWN = Set.of(
                "folder", "peer-id", "peer-trust-domain", "listen", "url", "rate", "duration", "requests");

        static Options parse(String[] argv) {
            Map<String, List<String>> values = new LinkedHashMap<>();
            for (int i = 1; i < argv.length; i++) {
                String arg = argv[i];
                if (!arg.startsWith("--")) {
                    throw new IllegalArgumentException("unexpected argument " + arg);
                }
                String name = arg.substring(2);
                String value;
                int equals = name.indexOf('=');
                if (equals >= 0) {
                    value = name.substring(equals + 1);
                    name = name.substring(0, equals);
                } else if (i + 1 < argv.length) {
                    value = argv[++i];
                } else {
                    throw new IllegalArgumentException("--" + name + " needs a value");
                }
                if (!KNOWN.contains(name)) {
                    throw new IllegalArgumentException("unknown flag --" + name);
                }
                values.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
            }
            return new Options(values);
        }

        List<String> all(String name) {
            return values.getOrDefault(name, List.of());
        }

        String one(String name, String fallback) {
            List<String> given = all(name);
            return given.isEmpty() ? fallback : given.get(given.size() - 1);
        }

        double number(String name, double fallback) {
            String text = one(name, null);
            try {
                return text == null ? fallback : Double.parseDouble(text);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("--" + name + " " + text + " is not a number");
            }
        }
    }

    /** Who the peer may be: one of the --peer-id IDs, or any ID of a --peer-trust-domain. */
    record Rule(Predicate<SpiffeId> test, String words) {
        static Rule of(Options options) {
            Set<String> ids = new LinkedHashSet<>();
            for (String id : options.all("peer-id")) {
                ids.add(SpiffeId.parse(id).toString());
            }
            Set<String> domains = new LinkedHashSet<>();
            for (String td : options.all("peer-trust-domain")) {
                domains.add(SpiffeId.parseTrustDomain(td));
            }
            if (ids.isEmpty() && domains.isEmpty()) {
                throw new IllegalArgumentException("no peer rule: give --peer-id or --peer-trust-domain");
            }
            List<String> words = new ArrayList<>();
            if (!ids.isEmpty()) {
                words.add("allowed IDs: " + String.join(", ", ids));
            }
            if (!domains.isEmpty()) {
                words.add("allowed trust domains: " + String.join(", ", domains));
            }
            return new Rule(id -> ids.contains(id.toString()) || domains.contains(id.trustDomain()),
                    String.join("; ", words));
        }
    }

    // --- the SSLContext ----------------------------------------------------------------------

    /**
     * What a workload needs: the folder, and SSLContexts over it for either end.
     *
     * <p>A resumed TLS session asks neither manager: the peer it names was judged when the
     * session began, against the files of that time. So this example never resumes: the
     * server keeps no tickets and invalidates each session after its handshake, and the client
     * takes a new context (a new, empty session cache) for each connection.
     */
    record Tls(CredentialFolder folder, KeyManager keys, TrustManager trust) {
        SSLContext context() throws GeneralSecurityException {
            SSLContext context = SSLContext.getInstance("TLS");
            context.init(new KeyManager[] {keys}, new TrustManager[] {trust}, null);
            return context;
        }
    }

    static Tls tls(Options options, Rule rule, java.util.function.Consumer<CredentialFolder.Credential> onPresent,
            java.util.function.Consumer<String> onRefusal) throws IOException, GeneralSecurityException {
        CredentialFolder folder = new CredentialFolder(CredentialFolder.locate(options.one("folder", null)),
                message -> System.err.println("spiffe-mtls: " + message));
        folder.credential(); // fail now, not at the first handshake, when there is none
        return new Tls(folder, new FolderKeyManager(folder, onPresent),
                new SpiffeTrustManager(folder, rule.test(), rule.words(), Date::new, onRefusal));
    }

    static String serial(X509Certificate certificate) {
        return certificate.getSerialNumber().toString(16);
    }

    // --- server ------------------------------------------------------------------------------

    static final class Stats {
        int served;
        int refused;
        final Set<String> callers = new TreeSet<>();
        final Set<String> clientSerials = new LinkedHashSet<>();
        final Set<String> presented = new LinkedHashSet<>();
    }

    static int server(Options options) throws IOException, GeneralSecurityException {
        Rule rule = Rule.of(options);
        Stats stats = new Stats();
        Tls tls = tls(options, rule, credential -> {
            boolean first;
            synchronized (stats) {
                first = stats.presented.add(credential.serial());
            }
            if (first) {
                emit(Map.of("event", "presented", "serial", credential.serial()));
            }
        }, reason -> {
            synchronized (stats) {
                stats.refused++;
            }
            emit(Map.of("event", "refused", "reason", reason));
        });
        String listen = options.one("listen", "127.0.0.1:8443");
        int colon = listen.lastIndexOf(':');
        if (colon < 0) {
            throw new IllegalArgumentException("--listen " + listen + " is not HOST:PORT");
        }
        SSLServerSocket listener = (SSLServerSocket) tls.context().getServerSocketFactory().createServerSocket();
        listener.setReuseAddress(true);
        listener.bind(new InetSocketAddress(InetAddress.getByName(listen.substring(0, colon)),
                Integer.parseInt(listen.substring(colon + 1))), 256);
        listener.setNeedClientAuth(true);
        ExecutorService connections = Executors.newCachedThreadPool(runnable -> {
            Thread thread = new Thread(runnable);
            thread.setDaemon(true);
            return thread;
        });
        CountDownLatch finished = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            closeQuietly(listener);
            try {
                finished.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        emit(Map.of("event", "listening", "listening",
                listen.substring(0, colon) + ":" + listener.getLocalPort(), "folder", tls.folder().dir().toString()));
        try {
            while (true) {
                Socket socket;
                try {
                    socket = listener.accept();
                } catch (IOException e) {
                    break; // closed by the shutdown hook
                }
                connections.execute(() -> serve((SSLSocket) socket, tls.folder(), stats));
            }
        } finally {
            connections.shutdown();
            try {
                connections.awaitTermination(2, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            String current = "";
            try {
                current = tls.folder().credential().serial();
            } catch (GeneralSecurityException e) {
                // no credential now: the summary says so with an empty serial
            }
            synchronized (stats) {
                Map<String, Object> summary = new LinkedHashMap<>();
                summary.put("served", stats.served);
                summary.put("refused", stats.refused);
                summary.put("callers", new ArrayList<>(stats.callers));
                summary.put("client_serials", new ArrayList<>(stats.clientSerials));
                summary.put("serial", current);
                emit(summary);
            }
            finished.countDown();
        }
        return 0;
    }

    /** One connection: the handshake (which authorizes the client) before any byte is read,
     * then HTTP/1.1 requests until the client or a drain closes it. */
    private static void serve(SSLSocket socket, CredentialFolder folder, Stats stats) {
        try (socket) {
            socket.setSoTimeout(TIMEOUT_MS);
            socket.startHandshake(); // a refused client ends here: SpiffeTrustManager threw
            SSLSession session = socket.getSession();
            X509Certificate client = (X509Certificate) session.getPeerCertificates()[0];
            X509Certificate presented = (X509Certificate) session.getLocalCertificates()[0];
            session.invalidate(); // never resumed: every connection is judged by a full handshake
            SpiffeId caller = SpiffeId.of(client);
            InputStream in = new BufferedInputStream(socket.getInputStream());
            OutputStream out = socket.getOutputStream();
            while (true) {
                Request request = Request.read(in);
                if (request == null) {
                    return;
                }
                boolean first;
                synchronized (stats) {
                    stats.served++;
                    stats.callers.add(caller.toString());
                    first = stats.clientSerials.add(serial(client));
                }
                if (first) {
                    emit(Map.of("event", "caller", "caller", caller.toString(), "caller_serial", serial(client)));
                }
                // Drain: a connection made with a credential since rotated gets this answer,
                // then is closed, so a keep-alive client reconnects and meets the new leaf.
                boolean rotated;
                try {
                    rotated = !folder.credential().serial().equals(serial(presented));
                } catch (GeneralSecurityException e) {
                    rotated = false;
                }
                boolean close = rotated || request.close();
                int status = request.method().equals("GET") && request.path().equals("/") ? 200 : 404;
                Map<String, Object> answer = new LinkedHashMap<>();
                answer.put("caller", caller.toString());
                answer.put("caller_serial", serial(client));
                answer.put("server_serial", serial(presented));
                byte[] body = (status == 200 ? json(answer) : "{\"error\":\"not found\"}").getBytes(StandardCharsets.UTF_8);
                String head = "HTTP/1.1 " + status + (status == 200 ? " OK" : " Not Found") + "\r\n"
                        + "Content-Type: application/json\r\nContent-Length: " + body.length + "\r\n"
                        + (close ? "Connection: close\r\n" : "") + "\r\n";
                out.write(head.getBytes(StandardCharsets.US_ASCII));
                out.write(body);
                out.flush();
                if (close) {
                    return;
                }
            }
        } catch (IOException | CertificateException e) {
            // Refused in the handshake (counted by the trust manager), timed out, or gone.
        }
    }

    /** An HTTP/1.1 request head; the body, if any, is read and dropped. */
    record Request(String method, String path, boolean close) {
        /** The next request, or null when the client closed the connection between requests. */
        static Request read(InputStream in) throws IOException {
            List<String> lines = new ArrayList<>();
            ByteArrayOutputStream line = new ByteArrayOutputStream();
            int total = 0;
            while (true) {
                int b = in.read();
                if (b < 0) {
                    if (lines.isEmpty() && line.size() == 0) {
                        return null;
                    }
                    throw new IOException("connection closed inside a request head");
                }
                if (++total > MAX_HEAD_BYTES) {
                    throw new IOException("request head too large");
                }
                if (b == '\n') {
                    String text = line.toString(StandardCharsets.ISO_8859_1).strip();
                    line.reset();
                    if (text.isEmpty()) {
                        if (lines.isEmpty()) {
                            continue; // a stray CRLF between requests
                        }
                        break;
                    }
                    lines.add(text);
                } else {
                    line.write(b);
                }
            }
            String[] requestLine = lines.get(0).split(" ");
            if (requestLine.length != 3) {
                throw new IOException("bad request line");
            }
            boolean close = requestLine[2].equals("HTTP/1.0");
            long length = 0;
            for (String header : lines.subList(1, lines.size())) {
                int colon = header.indexOf(':');
                if (colon < 0) {
                    continue;
                }
                String name = header.substring(0, colon).strip().toLowerCase(Locale.ROOT);
                String value = header.substring(colon + 1).strip();
                if (name.equals("connection")) {
                    close = value.equalsIgnoreCase("close");
                } else if (name.equals("content-length")) {
                    try {
                        length = Long.parseLong(value);
                    } catch (NumberFormatException e) {
                        throw new IOException("bad Content-Length");
                    }
                } else if (name.equals("transfer-encoding")) {
                    throw new IOException("chunked request bodies are not supported");
                }
            }
            in.skipNBytes(length);
            return new Request(requestLine[0], requestLine[1], close);
        }
    }

    // --- client ------------------------------------------------------------------------------

    static int client(Options options) throws IOException, GeneralSecurityException {
        Rule rule = Rule.of(options);
        URI url = URI.create(options.one("url", ""));
        if (!"https".equals(url.getScheme()) || url.getHost() == null) {
            throw new IllegalArgumentException("--url must be https://HOST:PORT/...");
        }
        double rate = options.number("rate", 20);
        double duration = options.number("duration", 0);
        long requests = (long) options.number("requests", 0);
        if (rate <= 0) {
            throw new IllegalArgumentException("--rate must be positive");
        }
        Tls tls = tls(options, rule, credential -> {}, reason -> {});
        int port = url.getPort() < 0 ? 443 : url.getPort();
        String path = url.getRawPath() == null || url.getRawPath().isEmpty() ? "/" : url.getRawPath();
        byte[] request = ("GET " + path + " HTTP/1.1\r\nHost: " + url.getHost() + ":" + port
                + "\r\nConnection: close\r\n\r\n").getBytes(StandardCharsets.US_ASCII);

        CountDownLatch finished = new CountDownLatch(1);
        Thread main = Thread.currentThread();
        boolean[] stop = {false};
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            synchronized (stop) {
                stop[0] = true;
            }
            main.interrupt();
            try {
                finished.await(15, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        int ok = 0;
        int failed = 0;
        Map<String, Integer> errors = new LinkedHashMap<>();
        Set<String> serverSerials = new LinkedHashSet<>();
        long started = System.nanoTime();
        long period = (long) (1e9 / rate);
        long sent = 0;
        while (true) {
            synchronized (stop) {
                if (stop[0]) {
                    break;
                }
            }
            if (duration > 0 && System.nanoTime() - started >= (long) (duration * 1e9)) {
                break;
            }
            if (requests > 0 && sent >= requests) {
                break;
            }
            sent++;
            try {
                X509Certificate server = call(tls.context(), url.getHost(), port, request);
                ok++;
                if (serverSerials.add(serial(server))) {
                    emit(Map.of("event", "server", "server_serial", serial(server),
                            "server_id", SpiffeId.of(server).toString()));
                }
            } catch (IOException | CertificateException e) {
                if (Thread.interrupted()) {
                    break; // stopped mid-call by SIGTERM: not a failure of the peer
                }
                failed++;
                String reason = e.getClass().getSimpleName() + ": " + e.getMessage();
                if (!errors.containsKey(reason)) {
                    System.err.println("spiffe-mtls: request failed: " + reason);
                }
                errors.merge(reason, 1, Integer::sum);
            }
            long wait = started + sent * period - System.nanoTime();
            if (wait > 0) {
                try {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                } catch (InterruptedException e) {
                    break;
                }
            }
        }
        Map<String, Object> summary = new LinkedHashMap<>();
        summary.put("requests", ok + failed);
        summary.put("ok", ok);
        summary.put("failed", failed);
        summary.put("errors", errors);
        summary.put("server_serials", new ArrayList<>(serverSerials));
        emit(summary);
        finished.countDown();
        return failed == 0 ? 0 : 1;
    }

    /** One GET on a new connection: the handshake (which authorizes the server) completes
     * before the request is written; returns the server's leaf if it answered 200. */
    private static X509Certificate call(SSLContext context, String host, int port, byte[] request)
            throws IOException, CertificateException {
        try (SSLSocket socket = (SSLSocket) context.getSocketFactory().createSocket()) {
            socket.connect(new InetSocketAddress(host, port), TIMEOUT_MS);
            socket.setSoTimeout(TIMEOUT_MS);
            socket.startHandshake(); // a refused server ends here: SpiffeTrustManager threw
            X509Certificate server = (X509Certificate) socket.getSession().getPeerCertificates()[0];
            OutputStream out = socket.getOutputStream();
            out.write(request);
            out.flush();
            byte[] response = socket.getInputStream().readNBytes(1 << 16);
            String text = new String(response, StandardCharsets.UTF_8);
            if (!text.startsWith("HTTP/1.1 200 ")) {
                int end = text.indexOf('\r');
                throw new IOException("the server answered " + (text.isEmpty() ? "nothing" : text.substring(0, end < 0 ? text.length() : end)));
            }
            return server;
        }
    }

    // --- output ------------------------------------------------------------------------------

    static synchronized void emit(Map<String, ?> value) {
        OUT.println(json(value));
        OUT.flush();
    }

    static String json(Object value) {
        StringBuilder out = new StringBuilder();
        write(out, value);
        return out.toString();
    }

    private static void write(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                out.append(first ? "" : ",");
                first = false;
                write(out, String.valueOf(entry.getKey()));
                out.append(':');
                write(out, entry.getValue());
            }
            out.append('}');
        } else if (value instanceof List<?> list) {
            out.append('[');
            for (int i = 0; i < list.size(); i++) {
                out.append(i == 0 ? "" : ",");
                write(out, list.get(i));
            }
            out.append(']');
        } else {
            out.append('"');
            for (char c : value.toString().toCharArray()) {
                switch (c) {
                    case '"' -> out.append("\\\"");
                    case '\\' -> out.append("\\\\");
                    case '\n' -> out.append("\\n");
                    case '\r' -> out.append("\\r");
                    case '\t' -> out.append("\\t");
                    default -> {
                        if (c < 0x20) {
                            out.append(String.format("\\u%04x", (int) c));
                        } else {
                            out.append(c);
                        }
                    }
                }
            }
            out.append('"');
        }
    }

    private static void closeQuietly(ServerSocket socket) {
        try {
            socket.close();
        } catch (IOException e) {
            // closing anyway
        }
    }
}
