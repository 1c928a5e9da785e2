//! Agent URLs as a log line may show them. A tenant's agent URL can carry
//! a password (`http://user:pw@host/`) or a token in its query
//! (`?token=…`): neither belongs in an operator's log, where anyone who
//! reads the logs would hold the tenant's credential.

/// `url` without its userinfo, query and fragment: what was there is
/// marked (`***@`, `?***`), so a reader knows the real URL had one. Text
/// that does not parse as a URL is cut the same way by hand (it may still
/// hold a credential).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.has_host() => {
            let userinfo = !u.username().is_empty() || u.password().is_some();
            let query = u.query().is_some() || u.fragment().is_some();
            // Only a URL that cannot have a host refuses these.
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            let mut s = u.to_string();
            if userinfo {
                if let Some(at) = s.find("://") {
                    s.insert_str(at + 3, "***@");
                }
            }
            if query {
                s.push_str("?***");
            }
            s
        }
        _ => redact_by_hand(url),
    }
}

fn redact_by_hand(text: &str) -> String {
    let (head, cut) = match text.find(['?', '#']) {
        Some(i) => (&text[..i], true),
        None => (text, false),
    };
    let mut s = match head.find("://") {
        Some(i) => {
            let rest = &head[i + 3..];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => format!("{}***@{}", &head[..i + 3], &rest[at + 1..]),
                None => head.to_owned(),
            }
        }
        // No scheme: anything before an `@` may be a password.
        None => match head.rfind('@') {
            Some(at) => format!("***@{}", &head[at + 1..]),
            None => head.to_owned(),
        },
    };
    if cut {
        s.push_str("?***");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_and_fragment_are_redacted() {
        assert_eq!(
            redact_url("http://bob:pw@host/?token=sekrit"),
            "http://***@host/?***"
        );
        assert_eq!(
            redact_url("https://bob@h.example:8443/a/b?x=1#frag"),
            "https://***@h.example:8443/a/b?***"
        );
        assert_eq!(redact_url("http://h:9/agent"), "http://h:9/agent");
        assert_eq!(redact_url("http://h/a#k=v"), "http://h/a?***");
    }

    #[test]
    fn text_that_is_not_a_url_is_cut_too() {
        for (raw, want) in [
            ("http://bob:pw@[bad/p?token=x", "http://***@[bad/p?***"),
            ("bob:pw@host?token=x", "***@host?***"),
            ("no-secrets-here", "no-secrets-here"),
        ] {
            let got = redact_url(raw);
            assert_eq!(got, want, "{raw}");
            assert!(!got.contains("pw") && !got.contains("token"), "{got}");
        }
    }
}
