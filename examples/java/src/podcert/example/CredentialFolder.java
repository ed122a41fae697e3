package podcert.example;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.PrivateKey;
import java.security.PublicKey;
import java.security.Signature;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;

/**
 * A SPIFFE Filesystem Delivery credential folder, read again on every call.
 *
 * <p>The folder holds {@code credential-bundle.pem} (one PKCS#8 {@code PRIVATE KEY} block, then
 * the {@code CERTIFICATE} blocks of the chain, leaf first) and one
 * {@code <trust-domain>.trust-bundle.pem} per trust domain. The kubelet (or podcert's shim)
 * replaces them through an atomic symlink swap, so one read of a file is always whole.
 *
 * <p>Guarantees:
 * <ul>
 *   <li>{@link #credential()} reads the file and returns the newest credential whose key
 *       matches its leaf and whose leaf carries one SPIFFE ID; content refused is reported once
 *       to the warning hook and the last good credential is kept. Parsing is cached by the
 *       content's SHA-256, so a call costs one small read and one hash.</li>
 *   <li>{@link #trustBundle(String)} returns the roots of that trust domain's file, read now; a
 *       trust domain without a file has no roots (its peers are refused from the next handshake
 *       on), and an unreadable or malformed file is an error, never stale roots.</li>
 *   <li>Keys are never printed: messages name files and problems, not key material.</li>
 * </ul>
 */
public final class CredentialFolder {
    public static final String ENV_VAR = "SPIFFE_CREDENTIAL_FOLDER";
    public static final String CREDENTIAL_FILE = "credential-bundle.pem";
    public static final String TRUST_BUNDLE_SUFFIX = ".trust-bundle.pem";
    public static final List<String> DEFAULT_FOLDERS = List.of(
            "/run/secrets/workload-spiffe-credentials",
            "/var/run/secrets/workload-spiffe-credentials");
    static final int MAX_FILE_BYTES = 1 << 20;

    /** A private key with its chain (leaf first), and the SHA-256 of the file they came from. */
    public record Credential(PrivateKey key, X509Certificate[] chain, SpiffeId id, String digest) {
        public X509Certificate leaf() {
            return chain[0];
        }

        public String serial() {
            return leaf().getSerialNumber().toString(16);
        }
    }

    private record CachedBundle(String digest, List<X509Certificate> roots) {}

    private final Path dir;
    private final Consumer<String> warn;
    private Credential credential; // the last good one
    private String refusedDigest = "";
    private final Map<String, CachedBundle> bundles = new HashMap<>();

    public CredentialFolder(Path dir, Consumer<String> warn) {
        this.dir = dir;
        this.warn = warn;
    }

    /** The standard's search: the explicit folder, else $SPIFFE_CREDENTIAL_FOLDER, else the
     * first default folder that exists. */
    public static Path locate(String explicit) throws IOException {
        if (explicit != null && !explicit.isEmpty()) {
            return Path.of(explicit);
        }
        String env = System.getenv(ENV_VAR);
        if (env != null && !env.isEmpty()) {
            return Path.of(env);
        }
        for (String folder : DEFAULT_FOLDERS) {
            if (Files.isDirectory(Path.of(folder))) {
                return Path.of(folder);
            }
        }
        throw new IOException("no credential folder: pass one, set " + ENV_VAR + ", or mount one at "
                + DEFAULT_FOLDERS.get(0));
    }

    public Path dir() {
        return dir;
    }

    /** The current credential (see the class comment); throws only while none was ever good. */
    public synchronized Credential credential() throws GeneralSecurityException {
        Path path = dir.resolve(CREDENTIAL_FILE);
        byte[] raw;
        try {
            raw = readCapped(path);
        } catch (IOException e) {
            return keep("credential bundle " + path + ": " + describe(e));
        }
        String digest = sha256(raw);
        if (credential != null && credential.digest().equals(digest)) {
            return credential;
        }
        if (digest.equals(refusedDigest)) {
            return keep(null);
        }
        try {
            credential = parseCredential(raw, digest);
            return credential;
        } catch (GeneralSecurityException | IllegalArgumentException e) {
            refusedDigest = digest;
            return keep("credential bundle " + path + ": " + e.getMessage());
        }
    }

    private Credential keep(String problem) throws GeneralSecurityException {
        if (credential == null) {
            throw new GeneralSecurityException(problem != null ? problem : "the credential bundle was refused before");
        }
        if (problem != null) {
            warn.accept("keeping the previous credential: " + problem);
        }
        return credential;
    }

    /** The roots of {@code trustDomain}, read now (see the class comment). */
    public synchronized List<X509Certificate> trustBundle(String trustDomain) throws CertificateException {
        SpiffeId.parseTrustDomain(trustDomain); // its characters cannot leave the folder
        Path path = dir.resolve(trustDomain + TRUST_BUNDLE_SUFFIX);
        byte[] raw;
        try {
            raw = readCapped(path);
        } catch (NoSuchFileException e) {
            bundles.remove(trustDomain);
            throw new CertificateException("no trust bundle for trust domain " + trustDomain + " in " + dir);
        } catch (IOException e) {
            bundles.remove(trustDomain);
            throw new CertificateException("trust bundle " + path + ": " + describe(e));
        }
        String digest = sha256(raw);
        CachedBundle cached = bundles.get(trustDomain);
        if (cached != null && cached.digest().equals(digest)) {
            return cached.roots();
        }
        bundles.remove(trustDomain);
        List<X509Certificate> roots = new ArrayList<>();
        for (Block block : pemBlocks(raw)) {
            if (!block.type().equals("CERTIFICATE")) {
                throw new CertificateException("trust bundle " + path + " holds a " + block.type() + " block");
            }
            roots.add(certificate(block.der()));
        }
        if (roots.isEmpty()) {
            throw new CertificateException("trust bundle " + path + " holds no certificate");
        }
        List<X509Certificate> frozen = List.copyOf(roots);
        bundles.put(trustDomain, new CachedBundle(digest, frozen));
        return frozen;
    }

    // --- parsing -----------------------------------------------------------------------------

    /** The key (the one PRIVATE KEY block, PKCS#8) and the chain (CERTIFICATE blocks, leaf
     * first); the key must be the leaf's, of the algorithm the leaf names. */
    static Credential parseCredential(byte[] raw, String digest) throws GeneralSecurityException {
        byte[] keyDer = null;
        List<X509Certificate> chain = new ArrayList<>();
        for (Block block : pemBlocks(raw)) {
            switch (block.type()) {
                case "PRIVATE KEY" -> {
                    if (keyDer != null) {
                        throw new GeneralSecurityException("more than one PRIVATE KEY block");
                    }
                    keyDer = block.der();
                }
                case "CERTIFICATE" -> chain.add(certificate(block.der()));
                default -> throw new GeneralSecurityException("unexpected " + block.type()
                        + " block (the folder's credential is PKCS#8 PRIVATE KEY, then CERTIFICATEs)");
            }
        }
        if (keyDer == null) {
            throw new GeneralSecurityException("no PRIVATE KEY block (PKCS#8)");
        }
        if (chain.isEmpty()) {
            throw new GeneralSecurityException("no CERTIFICATE block");
        }
        X509Certificate leaf = chain.get(0);
        PublicKey publicKey = leaf.getPublicKey();
        PrivateKey key;
        try {
            // EC, RSA or EdDSA (Ed25519): the leaf's algorithm, so key and leaf agree as JSSE asks.
            key = KeyFactory.getInstance(publicKey.getAlgorithm())
                    .generatePrivate(new PKCS8EncodedKeySpec(keyDer));
        } catch (NoSuchAlgorithmException e) {
            throw new GeneralSecurityException("the leaf's key algorithm " + publicKey.getAlgorithm()
                    + " is not supported by this JDK");
        } catch (GeneralSecurityException e) {
            throw new GeneralSecurityException("the PRIVATE KEY block is not a PKCS#8 "
                    + publicKey.getAlgorithm() + " key matching the leaf");
        } finally {
            Arrays.fill(keyDer, (byte) 0);
        }
        if (!keyMatches(key, publicKey)) {
            throw new GeneralSecurityException("the private key does not match the leaf certificate");
        }
        return new Credential(key, chain.toArray(new X509Certificate[0]), SpiffeId.of(leaf), digest);
    }

    /** Whether {@code key} signs what {@code publicKey} verifies: the one check that works for
     * every key type alike. */
    private static boolean keyMatches(PrivateKey key, PublicKey publicKey) throws GeneralSecurityException {
        String algorithm = switch (key.getAlgorithm()) {
            case "EC" -> "SHA256withECDSA";
            case "RSA" -> "SHA256withRSA";
            case "RSASSA-PSS" -> "RSASSA-PSS";
            default -> key.getAlgorithm(); // EdDSA, Ed25519, Ed448: the key names its scheme
        };
        byte[] message = "podcert credential check".getBytes(StandardCharsets.US_ASCII);
        Signature signer = Signature.getInstance(algorithm);
        if (algorithm.equals("RSASSA-PSS")) {
            signer.setParameter(new java.security.spec.PSSParameterSpec("SHA-256", "MGF1",
                    java.security.spec.MGF1ParameterSpec.SHA256, 32, 1));
        }
        signer.initSign(key);
        signer.update(message);
        byte[] signature = signer.sign();
        Signature verifier = Signature.getInstance(algorithm);
        if (algorithm.equals("RSASSA-PSS")) {
            verifier.setParameter(new java.security.spec.PSSParameterSpec("SHA-256", "MGF1",
                    java.security.spec.MGF1ParameterSpec.SHA256, 32, 1));
        }
        verifier.initVerify(publicKey);
        verifier.update(message);
        return verifier.verify(signature);
    }

    private static X509Certificate certificate(byte[] der) throws CertificateException {
        InputStream in = new ByteArrayInputStream(der);
        return (X509Certificate) CertificateFactory.getInstance("X.509").generateCertificate(in);
    }

    record Block(String type, byte[] der) {}

    /** PEM blocks in order; text outside blocks is ignored, as PEM readers do. A block that
     * does not close, or whose body is not base64, is an error naming its type. */
    static List<Block> pemBlocks(byte[] raw) throws CertificateException {
        String text = new String(raw, StandardCharsets.US_ASCII);
        List<Block> blocks = new ArrayList<>();
        int at = 0;
        while (true) {
            int begin = text.indexOf("-----BEGIN ", at);
            if (begin < 0) {
                return blocks;
            }
            int typeEnd = text.indexOf("-----", begin + 11);
            if (typeEnd < 0) {
                throw new CertificateException("PEM: a BEGIN line does not end");
            }
            String type = text.substring(begin + 11, typeEnd);
            String endLine = "-----END " + type + "-----";
            int end = text.indexOf(endLine, typeEnd + 5);
            if (end < 0) {
                throw new CertificateException("PEM: the " + type + " block does not end");
            }
            String body = text.substring(typeEnd + 5, end);
            try {
                blocks.add(new Block(type, Base64.getMimeDecoder().decode(body)));
            } catch (IllegalArgumentException e) {
                throw new CertificateException("PEM: the " + type + " block is not base64");
            }
            at = end + endLine.length();
        }
    }

    private static byte[] readCapped(Path path) throws IOException {
        try (InputStream in = Files.newInputStream(path)) {
            byte[] raw = in.readNBytes(MAX_FILE_BYTES + 1);
            if (raw.length > MAX_FILE_BYTES) {
                throw new IOException("larger than " + MAX_FILE_BYTES + " bytes");
            }
            return raw;
        }
    }

    private static String sha256(byte[] raw) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(raw));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every JDK has SHA-256", e);
        }
    }

    private static String describe(IOException e) {
        return e instanceof NoSuchFileException ? "no such file" : e.getClass().getSimpleName() + ": " + e.getMessage();
    }
}
