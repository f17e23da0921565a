//! Continue tokens: opaque to clients, they pin a paged list to one prefix and one revision.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::types::{KeyValue, ListRequest, ListResponse, Revision};

#[derive(Serialize, Deserialize)]
struct Token {
    v: u8,
    rev: String,
    prefix: String,
    start: String,
}

/// Where a list page starts: the prefix, the revision every page is read at, and the first
/// key (inclusive) of the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The list's prefix.
    pub prefix: Bytes,
    /// The revision of the first page; `None` until the first page is read.
    pub revision: Option<Revision>,
    /// The first key of this page.
    pub start: Bytes,
}

impl Cursor {
    /// Resolves a request into a cursor, decoding and checking its continue token.
    pub fn from_request(req: &ListRequest) -> Result<Cursor> {
        let Some(token) = &req.continue_token else {
            return Ok(Cursor {
                prefix: req.prefix.clone(),
                revision: req.revision.clone(),
                start: req.prefix.clone(),
            });
        };
        let bad = |reason: &str| StoreError::InvalidToken {
            what: "continue token",
            reason: reason.to_owned(),
        };
        let raw = URL_SAFE_NO_PAD
            .decode(token.as_bytes())
            .map_err(|_| bad("not a token this server issued (bad encoding)"))?;
        let t: Token = serde_json::from_slice(&raw)
            .map_err(|_| bad("not a token this server issued (bad contents)"))?;
        if t.v != 1 {
            return Err(bad("unknown token version"));
        }
        let prefix = Bytes::from(
            URL_SAFE_NO_PAD
                .decode(t.prefix.as_bytes())
                .map_err(|_| bad("bad prefix"))?,
        );
        let start = Bytes::from(
            URL_SAFE_NO_PAD
                .decode(t.start.as_bytes())
                .map_err(|_| bad("bad start key"))?,
        );
        if !req.prefix.is_empty() && req.prefix != prefix {
            return Err(bad("the token belongs to a list of another prefix"));
        }
        if !start.starts_with(&prefix) {
            return Err(bad("the start key is outside the prefix"));
        }
        let revision: Revision = t.rev.parse()?;
        if let Some(asked) = &req.revision
            && *asked != revision
        {
            return Err(bad(
                "a continued list is read at its first page's revision; do not set a revision with a token",
            ));
        }
        Ok(Cursor {
            prefix,
            revision: Some(revision),
            start,
        })
    }

    /// Assembles a page: when `more` keys follow, its continue token starts after the last.
    pub fn page(&self, kvs: Vec<KeyValue>, revision: Revision, more: bool) -> ListResponse {
        let continue_token = match (more, kvs.last()) {
            (true, Some(last)) => Some(self.next_token(&revision, &last.key)),
            _ => None,
        };
        ListResponse {
            kvs,
            revision,
            continue_token,
        }
    }

    /// The token for the page that starts just after `last_key`.
    pub fn next_token(&self, revision: &Revision, last_key: &[u8]) -> String {
        let mut start = last_key.to_vec();
        start.push(0);
        self.token_at(revision, &start)
    }

    /// A token for the page that starts at `start` (inclusive).
    pub fn token_at(&self, revision: &Revision, start: &[u8]) -> String {
        let token = Token {
            v: 1,
            rev: revision.to_string(),
            prefix: URL_SAFE_NO_PAD.encode(&self.prefix),
            start: URL_SAFE_NO_PAD.encode(start),
        };
        // Serializing this plain struct cannot fail.
        let json = serde_json::to_vec(&token).unwrap_or_default();
        URL_SAFE_NO_PAD.encode(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips_and_rejects_garbage() {
        let first = ListRequest {
            prefix: Bytes::from_static(b"/registry/pods/"),
            limit: 2,
            ..Default::default()
        };
        let cursor = Cursor::from_request(&first).expect("first page");
        let token = cursor.next_token(&Revision::single(7), b"/registry/pods/a/b");
        let next = ListRequest {
            continue_token: Some(token.clone()),
            ..first.clone()
        };
        let c = Cursor::from_request(&next).expect("decodes");
        assert_eq!(c.revision, Some(Revision::single(7)));
        assert_eq!(&c.start[..], b"/registry/pods/a/b\0");

        let other_prefix = ListRequest {
            prefix: Bytes::from_static(b"/registry/nodes/"),
            continue_token: Some(token),
            ..Default::default()
        };
        assert!(Cursor::from_request(&other_prefix).is_err());
        for garbage in ["", "!!!", "eyJ2IjoyfQ"] {
            let req = ListRequest {
                continue_token: Some(garbage.into()),
                ..Default::default()
            };
            assert!(Cursor::from_request(&req).is_err(), "{garbage}");
        }
    }
}
