package podcert.example;

import java.net.Socket;
import java.security.GeneralSecurityException;
import java.security.Principal;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Consumer;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.X509ExtendedKeyManager;

/**
 * Presents the folder's current credential on every handshake, client or server side.
 *
 * <p>JSSE asks for an alias first and then, in separate calls, for the key and the chain of
 * that alias; a rotation may land between those calls. So the alias names the credential
 * itself (its file's SHA-256), and the key and chain are looked up by it among the last few
 * credentials: a handshake always gets a key and chain of the same credential.
 *
 * <p>An alias is offered only for the key type JSSE asks for ({@code EC}, {@code RSA},
 * {@code EdDSA}...), so JSSE never pairs our key with a signature scheme it cannot make.
 */
public final class FolderKeyManager extends X509ExtendedKeyManager {
    private static final String PREFIX = "podcert-";
    private static final int KEPT = 4;

    private final CredentialFolder folder;
    private final Consumer<CredentialFolder.Credential> onPresent;
    private final Map<String, CredentialFolder.Credential> recent = new LinkedHashMap<>(); // oldest first

    /** {@code onPresent} hears of each credential chosen for a handshake (for logs and tests). */
    public FolderKeyManager(CredentialFolder folder, Consumer<CredentialFolder.Credential> onPresent) {
        this.folder = folder;
        this.onPresent = onPresent;
    }

    private String choose(String... keyTypes) {
        CredentialFolder.Credential credential;
        try {
            credential = folder.credential();
        } catch (GeneralSecurityException e) {
            return null; // no usable credential yet: JSSE fails the handshake
        }
        String algorithm = credential.key().getAlgorithm();
        if (keyTypes == null || !Arrays.asList(keyTypes).contains(algorithm)) {
            return null;
        }
        String alias = PREFIX + credential.digest();
        synchronized (recent) {
            recent.remove(alias);
            recent.put(alias, credential);
            while (recent.size() > KEPT) {
                recent.remove(recent.keySet().iterator().next());
            }
        }
        onPresent.accept(credential);
        return alias;
    }

    private CredentialFolder.Credential lookup(String alias) {
        synchronized (recent) {
            return alias == null ? null : recent.get(alias);
        }
    }

    @Override
    public String chooseEngineServerAlias(String keyType, Principal[] issuers, SSLEngine engine) {
        return choose(keyType);
    }

    @Override
    public String chooseServerAlias(String keyType, Principal[] issuers, Socket socket) {
        return choose(keyType);
    }

    // The peer's list of acceptable issuers is not consulted: a workload has one credential.
    @Override
    public String chooseEngineClientAlias(String[] keyTypes, Principal[] issuers, SSLEngine engine) {
        return choose(keyTypes);
    }

    @Override
    public String chooseClientAlias(String[] keyTypes, Principal[] issuers, Socket socket) {
        return choose(keyTypes);
    }

    @Override
    public X509Certificate[] getCertificateChain(String alias) {
        CredentialFolder.Credential credential = lookup(alias);
        return credential == null ? null : credential.chain().clone();
    }

    @Override
    public PrivateKey getPrivateKey(String alias) {
        CredentialFolder.Credential credential = lookup(alias);
        return credential == null ? null : credential.key();
    }

    @Override
    public String[] getServerAliases(String keyType, Principal[] issuers) {
        String alias = choose(keyType);
        return alias == null ? null : new String[] {alias};
    }

    @Override
    public String[] getClientAliases(String keyType, Principal[] issuers) {
        return getServerAliases(keyType, issuers);
    }
}
