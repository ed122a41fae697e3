package podcert.example;

import java.security.cert.CertificateException;
import java.security.cert.CertificateParsingException;
import java.security.cert.X509Certificate;
import java.util.Collection;
import java.util.List;
import java.util.regex.Pattern;

/**
 * A SPIFFE ID as the X509-SVID standard puts it in a certificate: the one URI SAN, scheme
 * {@code spiffe}, a trust domain of lowercase letters, digits, dots, dashes and underscores,
 * and a path of segments of letters, digits, dots, dashes and underscores (no "." or ".."
 * segment, no trailing slash, no query or fragment).
 */
public record SpiffeId(String trustDomain, String path) {
    private static final Pattern TRUST_DOMAIN = Pattern.compile("[a-z0-9._-]+");
    private static final Pattern SEGMENT = Pattern.compile("[A-Za-z0-9._-]+");
    private static final int URI_SAN = 6; // GeneralName tag: uniformResourceIdentifier
    private static final int MAX_LENGTH = 2048;

    /** Parses {@code spiffe://td/path}; IllegalArgumentException names what is wrong. */
    public static SpiffeId parse(String text) {
        if (text.length() > MAX_LENGTH) {
            throw new IllegalArgumentException("SPIFFE ID longer than " + MAX_LENGTH + " characters");
        }
        if (!text.startsWith("spiffe://")) {
            throw new IllegalArgumentException("not a SPIFFE ID (scheme must be spiffe://): " + text);
        }
        String rest = text.substring("spiffe://".length());
        int slash = rest.indexOf('/');
        String trustDomain = slash < 0 ? rest : rest.substring(0, slash);
        String path = slash < 0 ? "" : rest.substring(slash);
        if (!TRUST_DOMAIN.matcher(trustDomain).matches()) {
            throw new IllegalArgumentException("SPIFFE ID " + text + ": bad trust domain " + trustDomain);
        }
        if (!path.isEmpty()) {
            for (String segment : path.substring(1).split("/", -1)) {
                if (!SEGMENT.matcher(segment).matches() || segment.equals(".") || segment.equals("..")) {
                    throw new IllegalArgumentException("SPIFFE ID " + text + ": bad path segment '" + segment + "'");
                }
            }
        }
        return new SpiffeId(trustDomain, path);
    }

    /** The trust domain name alone ({@code example.org}); the same character rules. */
    public static String parseTrustDomain(String text) {
        if (!TRUST_DOMAIN.matcher(text).matches() || text.length() > 255) {
            throw new IllegalArgumentException("bad trust domain: " + text);
        }
        return text;
    }

    /** The SPIFFE ID of an X509-SVID: exactly one URI SAN, and a valid SPIFFE ID. */
    public static SpiffeId of(X509Certificate certificate) throws CertificateException {
        Collection<List<?>> names;
        try {
            names = certificate.getSubjectAlternativeNames();
        } catch (CertificateParsingException e) {
            throw new CertificateException("cannot read the certificate's SANs: " + e.getMessage(), e);
        }
        String uri = null;
        if (names != null) {
            for (List<?> name : names) {
                if (name.size() >= 2 && Integer.valueOf(URI_SAN).equals(name.get(0))) {
                    if (uri != null) {
                        throw new CertificateException("certificate holds more than one URI SAN");
                    }
                    uri = String.valueOf(name.get(1));
                }
            }
        }
        if (uri == null) {
            throw new CertificateException("certificate holds no URI SAN (no SPIFFE ID)");
        }
        try {
            return parse(uri);
        } catch (IllegalArgumentException e) {
            throw new CertificateException(e.getMessage(), e);
        }
    }

    @Override
    public String toString() {
        return "spiffe://" + trustDomain + path;
    }
}
