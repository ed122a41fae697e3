package podcert.example;

import java.net.Socket;
import java.security.GeneralSecurityException;
import java.security.cert.CertPath;
import java.security.cert.CertPathValidator;
import java.security.cert.CertPathValidatorException;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.PKIXParameters;
import java.security.cert.TrustAnchor;
import java.security.cert.X509Certificate;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Date;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Consumer;
import java.util.function.Predicate;
import java.util.function.Supplier;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.X509ExtendedTrustManager;

/**
 * Judges the peer inside the TLS handshake: its chain, then its SPIFFE ID.
 *
 * <ol>
 *   <li>The leaf carries exactly one URI SAN, a SPIFFE ID; its trust domain picks the roots:
 *       {@code <trust-domain>.trust-bundle.pem}, read from the folder now. A trust domain
 *       without a file is refused, and a federated domain's roots vouch for its own IDs only.</li>
 *   <li>The chain is PKIX-validated against those roots at the current time (revocation is
 *       not checked: pod certificates are short-lived and rotated instead).</li>
 *   <li>The leaf is an end entity fit for the peer's role: not a CA, a digitalSignature key
 *       usage without keyCertSign or cRLSign, and if it names extended key usages, the
 *       role's (clientAuth for a client, serverAuth for a server) among them.</li>
 *   <li>The SPIFFE ID must satisfy the authorization rule.</li>
 * </ol>
 *
 * <p>Any failure throws CertificateException, so JSSE aborts the handshake with an alert: a
 * refused client never reaches the application, a refused server never receives a byte of the
 * request. Host names are never checked (a pod certificate names a workload, not a host), even
 * when the caller asks for HTTPS endpoint identification: as an X509ExtendedTrustManager this
 * class is the whole check.
 */
public final class SpiffeTrustManager extends X509ExtendedTrustManager {
    private static final String CLIENT_AUTH = "1.3.6.1.5.5.7.3.2";
    private static final String SERVER_AUTH = "1.3.6.1.5.5.7.3.1";
    private static final String ANY_USAGE = "2.5.29.37.0";
    private static final int DIGITAL_SIGNATURE = 0;
    private static final int KEY_CERT_SIGN = 5;
    private static final int CRL_SIGN = 6;

    private final CredentialFolder folder;
    private final Predicate<SpiffeId> authorized;
    private final String rule;
    private final Supplier<Date> clock;
    private final Consumer<String> onRefusal;

    /**
     * @param authorized which SPIFFE IDs may be the peer
     * @param rule the rule in words, for refusal messages
     * @param onRefusal hears the reason of each refusal (for logs and counters)
     */
    public SpiffeTrustManager(CredentialFolder folder, Predicate<SpiffeId> authorized, String rule,
            Supplier<Date> clock, Consumer<String> onRefusal) {
        this.folder = folder;
        this.authorized = authorized;
        this.rule = rule;
        this.clock = clock;
        this.onRefusal = onRefusal;
    }

    /** The peer's SPIFFE ID if its chain verifies and the rule allows it; else an exception
     * whose message is the reason. */
    public SpiffeId check(X509Certificate[] chain, boolean peerIsClient) throws CertificateException {
        try {
            return judge(chain, peerIsClient);
        } catch (CertificateException e) {
            onRefusal.accept(e.getMessage());
            throw e;
        }
    }

    private SpiffeId judge(X509Certificate[] chain, boolean peerIsClient) throws CertificateException {
        if (chain == null || chain.length == 0) {
            throw new CertificateException("the peer sent no certificate");
        }
        X509Certificate leaf = chain[0];
        SpiffeId id = SpiffeId.of(leaf);
        List<X509Certificate> roots = folder.trustBundle(id.trustDomain());
        verifyChain(chain, roots, id);
        checkLeaf(leaf, peerIsClient ? CLIENT_AUTH : SERVER_AUTH, id);
        if (!authorized.test(id)) {
            throw new CertificateException("peer " + id + " is not allowed (" + rule + ")");
        }
        return id;
    }

    private void verifyChain(X509Certificate[] chain, List<X509Certificate> roots, SpiffeId id)
            throws CertificateException {
        Set<TrustAnchor> anchors = new HashSet<>();
        for (X509Certificate root : roots) {
            anchors.add(new TrustAnchor(root, null));
        }
        // A peer may send its root too; PKIX wants the path without its anchor.
        List<X509Certificate> path = new ArrayList<>(Arrays.asList(chain));
        while (path.size() > 1 && roots.contains(path.get(path.size() - 1))) {
            path.remove(path.size() - 1);
        }
        try {
            CertPath certPath = CertificateFactory.getInstance("X.509").generateCertPath(path);
            PKIXParameters parameters = new PKIXParameters(anchors);
            parameters.setRevocationEnabled(false);
            parameters.setDate(clock.get());
            CertPathValidator.getInstance("PKIX").validate(certPath, parameters);
        } catch (CertPathValidatorException e) {
            throw new CertificateException("the chain of " + id + " does not verify against the "
                    + id.trustDomain() + " trust bundle: " + e.getMessage(), e);
        } catch (GeneralSecurityException e) {
            throw new CertificateException("cannot validate the chain of " + id + ": " + e.getMessage(), e);
        }
    }

    private static void checkLeaf(X509Certificate leaf, String purpose, SpiffeId id) throws CertificateException {
        if (leaf.getBasicConstraints() != -1) {
            throw new CertificateException("the leaf of " + id + " is a CA certificate");
        }
        boolean[] usage = leaf.getKeyUsage();
        if (usage == null || !usage[DIGITAL_SIGNATURE]) {
            throw new CertificateException("the leaf of " + id + " lacks the digitalSignature key usage");
        }
        if ((usage.length > KEY_CERT_SIGN && usage[KEY_CERT_SIGN]) || (usage.length > CRL_SIGN && usage[CRL_SIGN])) {
            throw new CertificateException("the leaf of " + id + " may sign certificates or CRLs");
        }
        List<String> extended = leaf.getExtendedKeyUsage();
        if (extended != null && !extended.contains(purpose) && !extended.contains(ANY_USAGE)) {
            throw new CertificateException("the leaf of " + id + " is not for "
                    + (purpose.equals(CLIENT_AUTH) ? "TLS clients" : "TLS servers"));
        }
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType, Socket socket) throws CertificateException {
        check(chain, true);
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType, Socket socket) throws CertificateException {
        check(chain, false);
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType, SSLEngine engine) throws CertificateException {
        check(chain, true);
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType, SSLEngine engine) throws CertificateException {
        check(chain, false);
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType) throws CertificateException {
        check(chain, true);
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType) throws CertificateException {
        check(chain, false);
    }

    /** Empty: roots differ per trust domain and change per handshake, and an empty list tells
     * a client that any issuer may do (RFC 8446 4.2.4, RFC 5246 7.4.4). */
    @Override
    public X509Certificate[] getAcceptedIssuers() {
        return new X509Certificate[0];
    }
}
