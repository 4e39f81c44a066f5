//! How to reach a cluster: its bootstrap addresses and the Kafka client properties a Kafka
//! user already writes (`security.protocol`, `ssl.ca.location`, `sasl.mechanism`, ...), read
//! from code, a Java `client.properties` file or `CHRONIK_KAFKA_*` variables, checked once, and
//! handed to librdkafka. Secrets (passwords, keys, JAAS lines) never leave this type in text:
//! `Debug` and every error built here print them as `[redacted]`.

use super::ClusterError;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use std::collections::BTreeMap;

/// Where a Kafka-protocol cluster is and how to connect to it.
///
/// ```
/// use chronik::kafka::KafkaConfig;
///
/// let config = KafkaConfig::new("broker-1.example.com:9092")
///     .set("security.protocol", "SASL_SSL")
///     .set("sasl.mechanism", "SCRAM-SHA-512")
///     .set("sasl.username", "orders-app")
///     .set("sasl.password", "s3cret");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaConfig {
    bootstrap: String,
    properties: BTreeMap<String, String>,
    /// The environment variable each property set by [`KafkaConfig::fill_from_env`] came
    /// from, to name it in errors.
    from_env: BTreeMap<String, String>,
}

/// Properties Chronik sets itself, for its delivery guarantees or from the address: a user's
/// value would silently break a contract, so it is refused with the reason, unless it is the
/// value Chronik sets (a `client.properties` file often holds `acks=all`). librdkafka's
/// aliases are listed too.
const MANAGED: &[(&str, &str)] = &[
    ("bootstrap.servers", "the brokers come from the kafka://HOST:PORT address"),
    ("metadata.broker.list", "the brokers come from the kafka://HOST:PORT address"),
    ("group.id", "Chronik names its groups (the application, or the consumer's group)"),
    ("transactional.id", "Chronik's processors name their transactions"),
    ("enable.idempotence", "Chronik sets it for its delivery guarantees"),
    ("acks", "Chronik writes with acks=all (its durability contract)"),
    ("request.required.acks", "Chronik writes with acks=all (its durability contract)"),
    ("isolation.level", "Chronik reads read_committed only"),
    ("enable.auto.commit", "Chronik commits offsets itself"),
    ("auto.commit.enable", "Chronik commits offsets itself"),
    ("enable.auto.offset.store", "Chronik commits offsets itself"),
    ("auto.offset.reset", "Chronik reads from the committed offset or the start"),
    ("enable.partition.eof", "Chronik needs to know where a partition ends"),
];

/// The property naming where disk stores are kept ([`KafkaConfig::state_dir`]).
const STATE_DIR: &str = "state.dir";

/// The key librdkafka reads for `key`: one name per property, so that a property given twice
/// under two names is seen as one.
fn canonical(key: &str) -> &str {
    match key {
        "sasl.mechanisms" => "sasl.mechanism",
        "request.required.acks" => "acks",
        "auto.commit.enable" => "enable.auto.commit",
        "metadata.broker.list" => "bootstrap.servers",
        other => other,
    }
}

/// The protocols of `security.protocol`.
const PROTOCOLS: &[&str] = &["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];

/// The SASL mechanisms this build speaks (librdkafka with OpenSSL, no Kerberos, no OIDC).
const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Whether a property's value is a secret: never printed, never in an error.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.contains("jaas")
        || key.contains("token")
        || key.contains("user.info")
        || key.contains("oauthbearer.config")
        || key == "ssl.key.pem"
}

impl KafkaConfig {
    /// A cluster at `bootstrap` (`host:port[,host:port...]`), over plaintext until properties
    /// say otherwise.
    pub fn new(bootstrap: impl Into<String>) -> KafkaConfig {
        KafkaConfig {
            bootstrap: bootstrap.into(),
            properties: BTreeMap::new(),
            from_env: BTreeMap::new(),
        }
    }

    /// Set one client property (Kafka's and librdkafka's names). Checked when connecting.
    #[must_use]
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> KafkaConfig {
        let key = key.into().trim().to_owned();
        self.from_env.remove(&key);
        self.properties.insert(key, value.into());
        self
    }

    /// Set every property of a Java `client.properties` text (`key=value`, `key: value` or
    /// `key value` lines, `#` and `!` comments, `\` continuations and escapes); later lines win.
    pub fn set_properties(mut self, text: &str) -> Result<KafkaConfig, ClusterError> {
        for (key, value) in parse_properties(text)? {
            self = self.set(key, value);
        }
        Ok(self)
    }

    /// Set the properties named by environment variables `<prefix><NAME>=value` that are not
    /// set yet (under any of their names; a `sasl.jaas.config` sets the username and the
    /// password): the name lowercased, `_` read as `.` and `__` as `_`
    /// (`CHRONIK_KAFKA_SASL_PASSWORD` is `sasl.password`). Every connection does this with
    /// `CHRONIK_KAFKA_` and the process's environment, so a program runs unchanged against a
    /// secured cluster given its properties in the environment; properties set in code win.
    /// Variables whose name or value is not UTF-8 are skipped.
    #[must_use]
    pub fn fill_from_env(
        mut self,
        prefix: &str,
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> KafkaConfig {
        for (name, value) in vars {
            let (Ok(variable), Ok(value)) = (name.into_string(), value.into_string()) else {
                continue;
            };
            let Some(name) = variable.strip_prefix(prefix).filter(|n| !n.is_empty()) else {
                continue;
            };
            let key = name.to_ascii_lowercase().replace("__", "\u{0}").replace('_', ".");
            let key = key.replace('\u{0}', "_");
            let given = self.properties.keys().any(|set| canonical(set) == canonical(&key));
            let jaas = self.properties.contains_key("sasl.jaas.config")
                && matches!(key.as_str(), "sasl.username" | "sasl.password");
            if !given && !jaas {
                self.from_env.insert(key.clone(), variable);
                self.properties.insert(key, value);
            }
        }
        self
    }

    /// How errors name property `key`: with the environment variable it came from, if any.
    fn named(&self, key: &str) -> String {
        match self.from_env.get(key) {
            Some(variable) => format!("{key} (from ${variable})"),
            None => key.to_owned(),
        }
    }

    /// The bootstrap addresses.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Where processors keep disk stores on this machine: the property `state.dir` (as in
    /// Kafka Streams; `CHRONIK_KAFKA_STATE_DIR` sets it), else `chronik-state` in the
    /// system's temporary directory. A cache of the changelogs: what is lost there is read
    /// again from the cluster. One per process: a store's directory is locked while in use.
    pub fn state_dir(&self) -> std::path::PathBuf {
        match self.properties.get(STATE_DIR) {
            Some(directory) => std::path::PathBuf::from(directory),
            None => std::env::temp_dir().join("chronik-state"),
        }
    }

    /// The value of property `key`, if set (secrets included: this is the caller's own data).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// The properties librdkafka gets, after the checks: the address as `host:port` pairs,
    /// a known protocol and mechanism, no property Chronik manages, Java-only spellings
    /// translated (`sasl.jaas.config`'s username and password, an empty
    /// `ssl.endpoint.identification.algorithm`).
    pub(crate) fn checked(&self) -> Result<BTreeMap<String, String>, ClusterError> {
        let bootstrap = &self.bootstrap;
        if bootstrap.is_empty()
            || !bootstrap.split(',').all(|a| {
                a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            })
        {
            let address = bootstrap.clone();
            return Err(ClusterError::Address { address, reason: "expected host:port" });
        }
        let mut out = BTreeMap::new();
        for (key, value) in &self.properties {
            if key == STATE_DIR {
                continue; // Chronik's own, not librdkafka's.
            }
            if let Some((_, reason)) = MANAGED.iter().find(|(managed, _)| managed == key) {
                // The value Chronik sets anyway is no contradiction: dropped.
                let same = match canonical(key) {
                    "acks" => matches!(value.trim().to_ascii_lowercase().as_str(), "all" | "-1"),
                    "bootstrap.servers" => value.trim() == self.bootstrap,
                    _ => false,
                };
                if same {
                    continue;
                }
                return Err(refused(&self.named(key), reason));
            }
            let pkcs12 = key == "ssl.keystore.type" && value.trim().eq_ignore_ascii_case("PKCS12");
            if pkcs12 {
                continue; // librdkafka's keystore is PKCS#12, and it has no such property
            }
            if key.starts_with("ssl.truststore.") || key == "ssl.keystore.type" {
                return Err(refused(
                    &self.named(key),
                    "a Java keystore property: give PEM files (ssl.ca.location, \
                     ssl.certificate.location, ssl.key.location) or a PKCS#12 \
                     ssl.keystore.location",
                ));
            }
            match key.as_str() {
                "sasl.jaas.config" => {
                    let (username, password) = jaas_credentials(value)?;
                    out.entry("sasl.username".to_owned()).or_insert(username);
                    out.entry("sasl.password".to_owned()).or_insert(password);
                }
                "sasl.mechanisms" | "sasl.mechanism" => {
                    if out.insert("sasl.mechanism".to_owned(), value.trim().to_owned()).is_some() {
                        let reason = "give either sasl.mechanism or sasl.mechanisms";
                        return Err(refused(&self.named(key), reason));
                    }
                }
                "ssl.endpoint.identification.algorithm" if value.trim().is_empty() => {
                    out.insert(key.clone(), "none".to_owned());
                }
                _ => {
                    // Explicit properties win over those a JAAS line gave.
                    out.insert(key.clone(), value.clone());
                }
            }
        }
        self.check_security(&mut out)?;
        Ok(out)
    }

    /// The protocol and the SASL mechanism of the properties `out`, checked together and
    /// written back in librdkafka's spelling.
    fn check_security(&self, out: &mut BTreeMap<String, String>) -> Result<(), ClusterError> {
        let protocol = match out.get("security.protocol") {
            None => "PLAINTEXT".to_owned(),
            Some(protocol) => {
                let upper = protocol.trim().to_ascii_uppercase();
                if !PROTOCOLS.contains(&upper.as_str()) {
                    return Err(ClusterError::Config {
                        key: self.named("security.protocol"),
                        reason: format!("{protocol:?} is not one of {}", PROTOCOLS.join(", ")),
                    });
                }
                upper
            }
        };
        let sasl = protocol.starts_with("SASL_");
        match (sasl, out.get("sasl.mechanism")) {
            (true, None) => {
                return Err(refused(
                    "sasl.mechanism",
                    "required with SASL_PLAINTEXT and SASL_SSL (PLAIN, SCRAM-SHA-256 or \
                     SCRAM-SHA-512)",
                ));
            }
            (true, Some(mechanism)) => {
                let upper = mechanism.to_ascii_uppercase();
                if !MECHANISMS.contains(&upper.as_str()) {
                    return Err(ClusterError::Config {
                        key: "sasl.mechanism".to_owned(),
                        reason: format!(
                            "{mechanism:?} is not built in (this build speaks {})",
                            MECHANISMS.join(", ")
                        ),
                    });
                }
                for needed in ["sasl.username", "sasl.password"] {
                    if !out.contains_key(needed) {
                        return Err(refused(needed, "required by SASL PLAIN and SCRAM"));
                    }
                }
                out.insert("sasl.mechanism".to_owned(), upper);
            }
            (false, Some(_)) => {
                return Err(ClusterError::Config {
                    key: "sasl.mechanism".to_owned(),
                    reason: format!(
                        "set, but security.protocol is {protocol}: use SASL_SSL (or \
                         SASL_PLAINTEXT) to authenticate with SASL"
                    ),
                });
            }
            (false, None) => {}
        }
        out.insert("security.protocol".to_owned(), protocol);
        Ok(())
    }

    /// `text` with every secret value of this configuration replaced by `[redacted]`.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let mut secrets: Vec<String> = self
            .properties
            .iter()
            .filter(|(key, value)| is_secret(key) && !value.is_empty())
            .map(|(_, value)| value.clone())
            .collect();
        if let Some(jaas) = self.properties.get("sasl.jaas.config")
            && let Ok((_, password)) = jaas_credentials(jaas)
            && !password.is_empty()
        {
            secrets.push(password);
        }
        // The longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        for secret in &secrets {
            text = text.replace(secret.as_str(), "[redacted]");
        }
        text
    }

    /// An error of creating a client with this configuration: librdkafka's text names the
    /// property and may quote its value, so it goes through [`KafkaConfig::redact`].
    pub(crate) fn client_error(&self, operation: &'static str, error: &KafkaError) -> ClusterError {
        match error {
            KafkaError::ClientConfig(_, description, key, _value) => {
                ClusterError::Config { key: self.named(key), reason: self.redact(description) }
            }
            other => ClusterError::Kafka { operation, message: self.redact(&other.to_string()) },
        }
    }

    /// A client configuration with Chronik's defaults and then these properties.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, ClusterError> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("socket.timeout.ms", "10000")
            .set("api.version.request", "true");
        for (key, value) in self.checked()? {
            config.set(key, value);
        }
        Ok(config)
    }
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(key, value)| {
                (key.as_str(), if is_secret(key) { "[redacted]" } else { value.as_str() })
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap", &self.bootstrap)
            .field("properties", &shown)
            .finish_non_exhaustive()
    }
}

fn refused(key: &str, reason: &str) -> ClusterError {
    ClusterError::Config { key: key.to_owned(), reason: reason.to_owned() }
}

/// The username and password of a Java client's `sasl.jaas.config` line, e.g.
/// `org.apache.kafka.common.security.plain.PlainLoginModule required username="u"
/// password="p";` (PLAIN and SCRAM login modules only; options quoted or not, blanks around
/// `=`).
fn jaas_credentials(line: &str) -> Result<(String, String), ClusterError> {
    let module = line.split_whitespace().next().unwrap_or("");
    if !module.ends_with(".PlainLoginModule") && !module.ends_with(".ScramLoginModule") {
        // Named only if it looks like a class name: the line may hold the credentials.
        let class = module.chars().all(|c| c.is_ascii_alphanumeric() || "._$".contains(c));
        let reason = if class && !module.is_empty() {
            format!(
                "login module {module:?} is not read (PlainLoginModule and ScramLoginModule are)"
            )
        } else {
            "the line does not start with a login module (PlainLoginModule or ScramLoginModule)"
                .to_owned()
        };
        return Err(ClusterError::Config { key: "sasl.jaas.config".to_owned(), reason });
    }
    let options = &line[module.len()..];
    let missing = || refused("sasl.jaas.config", "expected username=\"...\" password=\"...\"");
    let username = jaas_option(options, "username").ok_or_else(missing)?;
    let password = jaas_option(options, "password").ok_or_else(missing)?;
    Ok((username, password))
}

/// The value of option `name` in a JAAS line's options: `name="quoted \" value"` or
/// `name=word`, blanks allowed around `=`.
fn jaas_option(options: &str, name: &str) -> Option<String> {
    let mut from = 0;
    while let Some(found) = options[from..].find(name) {
        let start = from + found;
        from = start + name.len();
        let before = options[..start].chars().next_back();
        if before.is_some_and(|c| !c.is_whitespace() && c != ';') {
            continue; // part of a longer word
        }
        let rest = options[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        let rest = rest.trim_start();
        let mut value = String::new();
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut chars = quoted.chars();
            loop {
                match chars.next()? {
                    '"' => return Some(value),
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        }
        value.extend(rest.chars().take_while(|c| !c.is_whitespace() && *c != ';'));
        return Some(value);
    }
    None
}

/// The `key`, `value` pairs of a Java properties text, in order.
fn parse_properties(text: &str) -> Result<Vec<(String, String)>, ClusterError> {
    let mut pairs = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        let mut logical = line.trim_start().to_owned();
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        // A line ending in an odd number of backslashes continues on the next one.
        while logical.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1 {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_property(&logical);
        if key.is_empty() {
            return Err(ClusterError::Config {
                key: String::new(),
                reason: format!("line {}: a property without a name", number + 1),
            });
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// One logical line's key and value, escapes read: the key ends at the first unescaped `=`,
/// `:` or blank; one `=` or `:` and the blanks around it separate it from the value.
fn split_property(line: &str) -> (String, String) {
    let mut key = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.push(unescape(&mut chars)),
            '=' | ':' => break,
            c if c.is_whitespace() => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if chars.peek().is_some_and(|c| *c == '=' || *c == ':') {
                    chars.next();
                }
                break;
            }
            c => key.push(c),
        }
    }
    while chars.peek().is_some_and(|c| c.is_whitespace()) {
        chars.next();
    }
    let mut value = String::new();
    while let Some(c) = chars.next() {
        if c == '\\' { value.push(unescape(&mut chars)) } else { value.push(c) }
    }
    (key, value)
}

/// The character an escape stands for, the backslash already read.
fn unescape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> char {
    match chars.next() {
        Some('t') => '\t',
        Some('n') => '\n',
        Some('r') => '\r',
        Some('f') => '\u{c}',
        Some('u') => {
            let hex: String = (0..4).filter_map(|_| chars.next()).collect();
            u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).unwrap_or('\u{fffd}')
        }
        Some(other) => other,
        None => '\\',
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(config: &KafkaConfig) -> String {
        config.checked().expect_err("refused").to_string()
    }

    #[test]
    fn plaintext_by_default_and_protocols_checked() {
        let checked = KafkaConfig::new("a:1,b:2").checked().unwrap();
        assert_eq!(checked.get("security.protocol").map(String::as_str), Some("PLAINTEXT"));
        let tls = KafkaConfig::new("a:1").set("security.protocol", "ssl").checked().unwrap();
        assert_eq!(tls.get("security.protocol").map(String::as_str), Some("SSL"));
        let bad = reason(&KafkaConfig::new("a:1").set("security.protocol", "TLS"));
        assert!(bad.contains("security.protocol") && bad.contains("SASL_SSL"), "{bad}");
        for address in ["", "a", "a:port", ":1", "a:1,"] {
            let error = KafkaConfig::new(address).checked().unwrap_err();
            assert!(matches!(error, ClusterError::Address { .. }), "{address}: {error}");
        }
    }

    #[test]
    fn sasl_needs_a_built_mechanism_and_credentials() {
        let base = KafkaConfig::new("a:1").set("security.protocol", "SASL_SSL");
        assert!(reason(&base).contains("sasl.mechanism"));
        let gssapi = reason(&base.clone().set("sasl.mechanism", "GSSAPI"));
        assert!(gssapi.contains("GSSAPI") && gssapi.contains("SCRAM-SHA-512"), "{gssapi}");
        let scram = base.clone().set("sasl.mechanisms", "scram-sha-256");
        assert!(reason(&scram).contains("sasl.username"));
        let full = scram.set("sasl.username", "u").set("sasl.password", "p").checked().unwrap();
        assert_eq!(full.get("sasl.mechanism").map(String::as_str), Some("SCRAM-SHA-256"));
        assert!(!full.contains_key("sasl.mechanisms"));
        let both = base.set("sasl.mechanism", "PLAIN").set("sasl.mechanisms", "PLAIN");
        assert!(reason(&both).contains("either"));
        let no_sasl = KafkaConfig::new("a:1").set("security.protocol", "SSL");
        let mismatch = reason(&no_sasl.set("sasl.mechanism", "PLAIN"));
        assert!(mismatch.contains("SASL_SSL"), "{mismatch}");
    }

    #[test]
    fn managed_and_java_only_properties_are_refused_by_name() {
        for key in ["group.id", "acks", "isolation.level", "bootstrap.servers"] {
            let error = reason(&KafkaConfig::new("a:1").set(key, "x"));
            assert!(error.contains(key), "{error}");
        }
        let jks = reason(&KafkaConfig::new("a:1").set("ssl.truststore.location", "/t.jks"));
        assert!(jks.contains("ssl.ca.location"), "{jks}");
        let jks = reason(&KafkaConfig::new("a:1").set("ssl.keystore.type", "JKS"));
        assert!(jks.contains("PKCS#12"), "{jks}");
        // Aliases, and the values Chronik sets anyway (a client.properties file has them).
        for (key, value) in [("request.required.acks", "1"), ("auto.commit.enable", "true")] {
            let error = reason(&KafkaConfig::new("a:1").set(key, value));
            assert!(error.contains(key), "{error}");
        }
        let other = reason(&KafkaConfig::new("a:1").set("bootstrap.servers", "b:1"));
        assert!(other.contains("bootstrap.servers"), "{other}");
        let same = KafkaConfig::new("a:1")
            .set("bootstrap.servers", "a:1")
            .set("acks", "all")
            .set("request.required.acks", "-1")
            .set("ssl.keystore.type", "PKCS12")
            .checked()
            .unwrap();
        for key in ["bootstrap.servers", "acks", "request.required.acks", "ssl.keystore.type"] {
            assert!(!same.contains_key(key), "{key} dropped: {same:?}");
        }
        let unknown = KafkaConfig::new("a:1").set("fetch.max.bytes", "1000").checked().unwrap();
        assert_eq!(unknown.get("fetch.max.bytes").map(String::as_str), Some("1000"));
    }

    #[test]
    fn jaas_lines_give_username_and_password() {
        let line = r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="app" password="p\"w;d";"#;
        let config = KafkaConfig::new("a:1")
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.jaas.config", line);
        let checked = config.checked().unwrap();
        assert_eq!(checked.get("sasl.username").map(String::as_str), Some("app"));
        assert_eq!(checked.get("sasl.password").map(String::as_str), Some("p\"w;d"));
        assert!(!checked.contains_key("sasl.jaas.config"));
        assert_eq!(config.redact("x p\"w;d y"), "x [redacted] y");
        let kerberos = "com.sun.security.auth.module.Krb5LoginModule required keyTab=\"k\";";
        let error = reason(&config.clone().set("sasl.jaas.config", kerberos));
        assert!(error.contains("Krb5LoginModule") && !error.contains("keyTab"), "{error}");
        let no_module = reason(&config.set("sasl.jaas.config", "password=\"hunter2\";"));
        assert!(
            !no_module.contains("hunter2") && no_module.contains("login module"),
            "{no_module}"
        );
    }

    #[test]
    fn secrets_never_print() {
        let config = KafkaConfig::new("a:1")
            .set("sasl.password", "hunter2")
            .set("ssl.key.password", "keypass")
            .set("ssl.key.pem", "-----BEGIN PRIVATE KEY-----")
            .set("basic.auth.user.info", "registry:pw");
        let debug = format!("{config:?}");
        for secret in ["hunter2", "keypass", "BEGIN PRIVATE", "registry:pw"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(debug.contains("sasl.password") && debug.contains("a:1"), "{debug}");
        let error = KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value \"hunter2\" for configuration property".to_owned(),
            "sasl.password".to_owned(),
            "hunter2".to_owned(),
        );
        // The canary: rdkafka's own text of this error quotes the value, so the check below
        // can fail, and would on any path that printed librdkafka's error as it is.
        assert!(error.to_string().contains("hunter2"));
        let shown = config.client_error("create", &error).to_string();
        assert!(shown.contains("sasl.password") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn java_properties_files_and_environment_variables() {
        let text = "# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism:PLAIN\n\
                    sasl.username app\nsasl.password=a\\\n    b\\u0021\\=\nssl.endpoint.identification.algorithm=\n";
        let config = KafkaConfig::new("a:1").set_properties(text).unwrap();
        assert_eq!(config.get("sasl.password"), Some("ab!="));
        assert_eq!(config.get("sasl.username"), Some("app"));
        assert_eq!(config.get("sasl.mechanism"), Some("PLAIN"));
        let checked = config.checked().unwrap();
        let algorithm = checked.get("ssl.endpoint.identification.algorithm");
        assert_eq!(algorithm.map(String::as_str), Some("none"));
        let config = config.fill_from_env(
            "CHRONIK_KAFKA_",
            env(&[
                ("CHRONIK_KAFKA_SASL_PASSWORD", "env"),
                ("CHRONIK_KAFKA_SASL_MECHANISMS", "SCRAM-SHA-256"),
                ("CHRONIK_KAFKA_LOG__LEVEL", "6"),
                ("CHRONIK_KAFKA_", "ignored"),
                ("HOME", "/root"),
            ]),
        );
        assert_eq!(config.get("sasl.password"), Some("ab!="), "set before: kept");
        assert_eq!(config.get("sasl.mechanisms"), None, "set before under its other name");
        assert_eq!(config.get("log_level"), Some("6"));
        assert_eq!(config.properties.len(), 6);
        let error = KafkaConfig::new("a:1").set_properties("=x").unwrap_err();
        assert!(error.to_string().contains("line 1"), "{error}");
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        pairs.iter().map(|(name, value)| ((*name).into(), (*value).into())).collect()
    }

    #[test]
    fn environment_variables_fill_what_code_left_and_are_named_in_errors() {
        use std::os::unix::ffi::OsStringExt;
        let jaas = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username = "u" password=p;"#;
        let mut vars = env(&[
            ("CHRONIK_KAFKA_SASL_PASSWORD", "from-env"),
            ("CHRONIK_KAFKA_SECURITY_PROTOCOL", "TLS"),
            ("CHRONIK_KAFKA_ACKS", "1"),
        ]);
        vars.push((std::ffi::OsString::from_vec(vec![0xff]), "not UTF-8".into()));
        vars.push(("CHRONIK_KAFKA_X".into(), std::ffi::OsString::from_vec(vec![0xfe])));
        let config = KafkaConfig::new("a:1").set("sasl.jaas.config", jaas);
        let config = config.fill_from_env("CHRONIK_KAFKA_", vars);
        assert_eq!(config.get("sasl.password"), None, "the JAAS line gives the password");
        assert_eq!(config.get("x"), None);
        let error = reason(&config);
        assert!(error.contains("$CHRONIK_KAFKA_ACKS"), "{error}");
        let config = config.set("acks", "all");
        let error = reason(&config);
        assert!(error.contains("$CHRONIK_KAFKA_SECURITY_PROTOCOL"), "{error}");
        let checked = config.set("security.protocol", "SASL_SSL").set("sasl.mechanism", "PLAIN");
        let checked = checked.checked().unwrap();
        assert_eq!(checked.get("sasl.username").map(String::as_str), Some("u"));
        assert_eq!(checked.get("sasl.password").map(String::as_str), Some("p"));
    }
}
