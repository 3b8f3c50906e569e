//! One rule for secrets in error messages, logs and status pages: an error names the field and
//! the position of what is wrong, never the value of a secret. Secrets are the values of keys
//! named like credentials ([`is_secret_key`]: `token`, `*_token`, `password`, `secret`,
//! `api_key`, `authorization`, `credentials`) and the user information and query of URLs.
//!
//! Errors are first written so that they do not quote input (config errors give the line and
//! column, not the line's text); [`message`] is the net under that: it removes every known
//! secret value and every URL credential from a finished message.

use std::borrow::Cow;

/// What a secret is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Secret values shorter than this are not searched for in messages: replacing every
/// occurrence of one or two characters would garble the message and hide nothing.
const MIN_SECRET_LEN: usize = 4;

/// Whether the value of a key with this name is a secret.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.trim().trim_matches(|c| c == '"' || c == '\'').to_ascii_lowercase();
    let k = k.rsplit('.').next().unwrap_or_default();
    k == "token"
        || k.ends_with("_token")
        || k.ends_with("-token")
        || k.contains("password")
        || k.contains("secret")
        || k.contains("credential")
        || matches!(k, "api_key" | "apikey" | "api-key" | "authorization")
}

/// The values of secret keys in a config or JSON text, read leniently line by line, so that
/// it works on text that does not parse (a dropped quote is the typical reason a reload
/// fails): `token = "abc` gives `abc`.
pub fn secret_values(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for piece in text.lines().flat_map(|line| line.split([',', '{', '}'])) {
        let Some((key, value)) = piece.split_once('=').or_else(|| piece.split_once(':')) else {
            continue;
        };
        if !is_secret_key(key) {
            continue;
        }
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'').trim();
        if value.len() >= MIN_SECRET_LEN && !out.iter().any(|v| v == value) {
            out.push(value.to_owned());
        }
    }
    out
}

/// `url` with its user information and query replaced: `https://u:p@host/x?k=v` becomes
/// `https://<redacted>@host/x?<redacted>`. Anything that is not a URL comes back unchanged.
pub fn url(url: &str) -> Cow<'_, str> {
    let Some(scheme_end) = url.find("://") else { return Cow::Borrowed(url) };
    let rest = &url[scheme_end + 3..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_len);
    let at = authority.rfind('@');
    let query = tail.find('?');
    if at.is_none() && query.is_none() {
        return Cow::Borrowed(url);
    }
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..scheme_end + 3]);
    match at {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    match query {
        Some(q) => {
            out.push_str(&tail[..=q]);
            out.push_str(REDACTED);
        }
        None => out.push_str(tail),
    }
    Cow::Owned(out)
}

/// `msg` without any of `secrets` and without the credentials and queries of the URLs in it.
pub fn message<S: AsRef<str>>(msg: &str, secrets: &[S]) -> String {
    let mut out = msg.to_owned();
    for secret in secrets.iter().map(AsRef::as_ref).filter(|s| s.len() >= MIN_SECRET_LEN) {
        if out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
    }
    if !out.contains("://") {
        return out;
    }
    // Every URL in the text, up to the first character that cannot be in one.
    let mut redacted = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(i) = rest.find("://") {
        let start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |j| j + 1);
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '<' | '>'))
            .map_or(rest.len(), |j| i + j);
        redacted.push_str(&rest[..start]);
        redacted.push_str(&url(&rest[start..end]));
        rest = &rest[end..];
    }
    redacted.push_str(rest);
    redacted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_keys() {
        for k in [
            "token",
            "control_plane.token",
            "\"token\"",
            "api_key",
            "bearer_token",
            "db_password",
            "Authorization",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["key", "cert", "tokens", "max_tokens", "expected_output_tokens", "url"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }

    #[test]
    fn secret_values_are_found_in_text_that_does_not_parse() {
        let text = "[control_plane]\ntoken = \"s3cr3t-value\nrho = 0.9\n[x]\ny = { api_key = 'k-123456', z = 1 }\n\"password\": \"hunter22\",";
        assert_eq!(secret_values(text), ["s3cr3t-value", "k-123456", "hunter22"]);
        assert!(secret_values("token = \"ab\"").is_empty(), "too short to search for");
    }

    #[test]
    fn urls_lose_credentials_and_queries() {
        assert_eq!(url("http://u:p@host:1/x"), "http://<redacted>@host:1/x");
        assert_eq!(url("https://host/v1?key=abc"), "https://host/v1?<redacted>");
        assert_eq!(url("http://host:8000"), "http://host:8000");
        assert_eq!(url("not a url"), "not a url");
        assert_eq!(url("http://a@b@host/"), "http://<redacted>@host/");
    }

    #[test]
    fn messages_lose_secrets_and_url_credentials() {
        let msg = "line 3: token s3cr3t-value; engines.a.url: 'http://admin:pw@10.0.0.1:8000/v1' must not carry credentials";
        assert_eq!(
            message(msg, &["s3cr3t-value"]),
            "line 3: token <redacted>; engines.a.url: 'http://<redacted>@10.0.0.1:8000/v1' must not carry credentials"
        );
        assert_eq!(message("no secrets here", &["x"]), "no secrets here");
    }
}
