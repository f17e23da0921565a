//! Kubernetes' name rules: DNS-1123 labels and subdomains, and qualified names (label keys).
//! Each check returns the reason a person needs, or `None` when the name is valid.

/// Longest DNS-1123 label (namespace names, label-key names).
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (most object names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Checks a DNS-1123 label: at most 63 characters, lowercase letters, digits and '-',
/// starting and ending with a letter or digit (namespace names, for example).
pub fn dns1123_label(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters (it is {})",
            s.len()
        ));
    }
    let b = s.as_bytes();
    let ok = b.iter().all(|c| alnum_lower(*c) || *c == b'-')
        && alnum_lower(b[0])
        && alnum_lower(b[b.len() - 1]);
    (!ok).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
         and must start and end with an alphanumeric character (e.g. 'my-name' or '123-abc')"
            .into()
    })
}

/// Checks a DNS-1123 subdomain: at most 253 characters, dot-separated labels of lowercase
/// letters, digits and '-' (most object names).
pub fn dns1123_subdomain(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".into());
    }
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters (it is {})",
            s.len()
        ));
    }
    let ok = s.split('.').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && b.iter().all(|c| alnum_lower(*c) || *c == b'-')
            && alnum_lower(b[0])
            && alnum_lower(b[b.len() - 1])
    });
    (!ok).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
         or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
            .into()
    })
}

/// The name part of a qualified name or a label value: alphanumerics, '-', '_' and '.',
/// starting and ending with an alphanumeric.
fn name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Checks a qualified name (a label or annotation key): an optional DNS subdomain prefix and
/// '/', then a name of at most 63 characters.
pub fn qualified_name(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must not be empty".into());
        }
        if let Some(why) = dns1123_subdomain(p) {
            return Some(format!("prefix part {why}"));
        }
    }
    if name.is_empty() {
        return Some("name part must not be empty".into());
    }
    if name.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "name part must be no more than {DNS1123_LABEL_MAX} characters (it is {})",
            name.len()
        ));
    }
    (!name_part(name)).then(|| {
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
         end with an alphanumeric character (e.g. 'MyName', 'my.name' or '123-abc')"
            .into()
    })
}

/// Checks a label value: empty, or at most 63 characters of alphanumerics, '-', '_' and '.',
/// starting and ending with an alphanumeric.
pub fn label_value(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters (it is {})",
            s.len()
        ));
    }
    (!name_part(s)).then(|| {
        "a valid label value must be an empty string or consist of alphanumeric characters, '-', \
         '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue' or \
         '12345')"
            .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for ok in ["a", "my-ns", "0abc", &"a".repeat(63)] {
            assert_eq!(dns1123_label(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_some(), "{bad}");
        }
        for ok in ["a.b", "example.com", "x-1.y-2"] {
            assert_eq!(dns1123_subdomain(ok), None, "{ok}");
        }
        for bad in ["", "a..b", ".a", "a.", "A.b", &"a".repeat(254)] {
            assert!(dns1123_subdomain(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn qualified_names_and_values() {
        for ok in [
            "app",
            "app.kubernetes.io/name",
            "tessera.io/tenant",
            "A_b.c-D",
        ] {
            assert_eq!(qualified_name(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "Bad_Prefix/a",
            "a/b/c",
            "-a",
            &"a".repeat(64),
        ] {
            assert!(qualified_name(bad).is_some(), "{bad}");
        }
        for ok in ["", "v1", "a.b_c-d"] {
            assert_eq!(label_value(ok), None, "{ok}");
        }
        for bad in ["-a", "a b", "é", &"a".repeat(64)] {
            assert!(label_value(bad).is_some(), "{bad}");
        }
    }
}
