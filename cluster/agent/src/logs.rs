//! Container logs of the process runtime: written as the kubelet writes them, served as the
//! kubelet serves them.
//!
//! **Writing.** A container's stdout and stderr are pipes; each line read becomes one line of
//! the CRI log format, `<RFC 3339 time with nanoseconds> <stdout|stderr> <F|P> <text>`
//! (`P` for a piece of a line longer than [`MAX_LINE`], `F` for its end), in
//! `<dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log`. A file that grows past its
//! limit is rotated once (`<restart>.log.1`), so a chatty container holds at most twice the
//! limit on disk; the pod's directory goes when the pod object does.
//!
//! **Serving.** `GET /containerLogs/{namespace}/{pod}/{container}?podUID=...` with the options
//! of [`LogOptions`] (`follow`, `previous`, `tailLines`, `sinceSeconds`/`sinceTime`,
//! `timestamps`, `limitBytes`), for the API server's `pods/log`. Only a bearer credential the
//! API server minted for this node ([`Tokens::node_token`]) is accepted.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use parking_lot::Mutex;
use tessera_client::auth::Tokens;
use tessera_client::request::{LogOptions, parse_params};
use tessera_client::status::ApiError;
use tessera_core::time::now_secs;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// The longest line kept whole; longer ones are split into `P` pieces (the kubelet's 16 KiB).
pub const MAX_LINE: usize = 16 * 1024;
/// How often a follower looks for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// The log files being written now (a follower of one of them waits for more).
pub type Live = Arc<Mutex<HashSet<PathBuf>>>;

/// The directory of a pod's logs.
pub fn pod_dir(dir: &Path, namespace: &str, pod: &str, uid: &str) -> PathBuf {
    dir.join(format!("{namespace}_{pod}_{uid}"))
}

/// The path of a container's log for its `restart`-th run.
pub fn log_path(pod_dir: &Path, container: &str, restart: u32) -> PathBuf {
    pod_dir.join(container).join(format!("{restart}.log"))
}

fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// One container run's log file, shared by the stdout and stderr pumps.
pub struct LogFile {
    path: PathBuf,
    file: std::fs::File,
    written: u64,
    max: u64,
}

/// A new (truncated) file only the agent may read: a container's output is its tenant's.
fn private_file(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
}

impl LogFile {
    /// A new, empty log at `path` that rotates past `max` bytes.
    pub fn create(path: &Path, max: u64) -> io::Result<LogFile> {
        if let Some(parent) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
        Ok(LogFile {
            path: path.to_owned(),
            file: private_file(path)?,
            written: 0,
            max,
        })
    }

    /// Appends whole lines, rotating between two lines when the file would pass its limit.
    fn append(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        while self.written + bytes.len() as u64 > self.max {
            let room = (self.max.saturating_sub(self.written) as usize).min(bytes.len());
            match bytes[..room].iter().rposition(|&b| b == b'\n') {
                Some(end) => {
                    self.file.write_all(&bytes[..=end])?;
                    bytes = &bytes[end + 1..];
                }
                // A line longer than the whole limit is kept whole.
                None if self.written == 0 => break,
                None => {}
            }
            std::fs::rename(&self.path, rotated(&self.path))?;
            self.file = private_file(&self.path)?;
            self.written = 0;
        }
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

fn timestamp() -> String {
    format!("{:.9}", jiff::Timestamp::now())
}

fn cri_line(out: &mut Vec<u8>, ts: &str, stream: &str, full: bool, text: &[u8]) {
    out.extend_from_slice(ts.as_bytes());
    out.push(b' ');
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(if full { b" F " } else { b" P " });
    out.extend_from_slice(text);
    out.push(b'\n');
}

/// Live output of a running container for `kubectl attach`: (channel, bytes), channel 1
/// for stdout and 2 for stderr.
pub type LiveOutput = tokio::sync::broadcast::Sender<(u8, Bytes)>;

/// Copies what a container writes to `stream` (`stdout`, `stderr`) into its log, a CRI line
/// per line, until the pipe closes; and, while anyone is attached, to `live`.
pub async fn pump(
    mut from: impl AsyncRead + Unpin,
    stream: &'static str,
    to: Arc<Mutex<LogFile>>,
    live: Option<LiveOutput>,
) {
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let channel = if stream == "stderr" { 2 } else { 1 };
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if n > 0
            && let Some(live) = &live
            && live.receiver_count() > 0
        {
            let _ = live.send((channel, Bytes::copy_from_slice(&buf[..n])));
        }
        let ts = timestamp();
        if n == 0 {
            if !line.is_empty() {
                cri_line(&mut out, &ts, stream, true, &line);
                let _ = to.lock().append(&out);
            }
            return;
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                cri_line(&mut out, &ts, stream, true, &line);
                line.clear();
            } else {
                line.push(b);
                if line.len() == MAX_LINE {
                    cri_line(&mut out, &ts, stream, false, &line);
                    line.clear();
                }
            }
        }
        if !out.is_empty() {
            if let Err(e) = to.lock().append(&out) {
                tracing::warn!(error = %e, "writing a container log");
            }
            out.clear();
        }
    }
}

/// One parsed CRI line.
struct Entry<'a> {
    ts: &'a str,
    nanos: i128,
    full: bool,
    text: &'a [u8],
}

fn parse(line: &[u8]) -> Option<Entry<'_>> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let ts = std::str::from_utf8(parts.next()?).ok()?;
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let text = parts.next().unwrap_or_default();
    let nanos = ts.parse::<jiff::Timestamp>().ok()?.as_nanosecond();
    Some(Entry {
        ts,
        nanos,
        full: tag != b"P",
        text,
    })
}

/// Turns CRI lines into what the client asked to see.
struct Render {
    timestamps: bool,
    since: Option<i128>,
    bytes_left: Option<u64>,
    /// The last line written was a piece: the next continues it (no timestamp again).
    in_line: bool,
}

impl Render {
    fn new(opts: &LogOptions) -> Render {
        let now = jiff::Timestamp::now().as_nanosecond();
        Render {
            timestamps: opts.timestamps,
            since: opts.since_nanos(now),
            bytes_left: opts.limit_bytes.map(|n| n.max(0) as u64),
            in_line: false,
        }
    }

    fn done(&self) -> bool {
        self.bytes_left == Some(0)
    }

    /// Renders whole CRI lines of `raw`, keeping only the last `tail` lines if asked.
    fn render(&mut self, raw: &[u8], tail: Option<i64>, out: &mut Vec<u8>) {
        let entries: Vec<Entry<'_>> = raw
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(parse)
            .filter(|e| self.since.is_none_or(|s| e.nanos >= s))
            .collect();
        let mut start = 0;
        if let Some(n) = tail {
            let mut seen = 0;
            for (i, e) in entries.iter().enumerate().rev() {
                if e.full {
                    seen += 1;
                    if seen > n {
                        start = i + 1;
                        break;
                    }
                }
            }
        }
        let before = out.len();
        for e in &entries[start..] {
            if self.timestamps && !self.in_line {
                out.extend_from_slice(e.ts.as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(e.text);
            if e.full {
                out.push(b'\n');
            }
            self.in_line = !e.full;
        }
        if let Some(left) = &mut self.bytes_left {
            let wrote = (out.len() - before) as u64;
            if wrote >= *left {
                out.truncate(before + *left as usize);
                *left = 0;
            } else {
                *left -= wrote;
            }
        }
    }
}

/// An open log file and how far it has been read.
struct Cursor {
    file: tokio::fs::File,
    ino: u64,
    /// Bytes read past the last complete line.
    rest: Vec<u8>,
}

impl Cursor {
    async fn open(path: &Path) -> io::Result<Cursor> {
        let file = tokio::fs::File::open(path).await?;
        let ino = file.metadata().await?.ino();
        Ok(Cursor {
            file,
            ino,
            rest: Vec::new(),
        })
    }

    /// The complete lines written since the last call.
    async fn read_lines(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = std::mem::take(&mut self.rest);
        self.file.read_to_end(&mut buf).await?;
        match buf.iter().rposition(|&b| b == b'\n') {
            Some(end) => {
                self.rest = buf.split_off(end + 1);
                Ok(buf)
            }
            None => {
                self.rest = buf;
                Ok(Vec::new())
            }
        }
    }
}

/// Streams a log: what is there, then (`follow`) what comes while the file is live.
async fn stream_log(path: PathBuf, opts: LogOptions, live: Live, tx: mpsc::Sender<Bytes>) {
    let mut render = Render::new(&opts);
    let mut raw = Vec::new();
    if let Ok(mut old) = Cursor::open(&rotated(&path)).await
        && let Ok(lines) = old.read_lines().await
    {
        raw = lines;
    }
    let Ok(mut cur) = Cursor::open(&path).await else {
        return;
    };
    let Ok(lines) = cur.read_lines().await else {
        return;
    };
    raw.extend_from_slice(&lines);
    let mut out = Vec::new();
    render.render(&raw, opts.tail_lines, &mut out);
    drop(raw);
    if !send(&tx, &mut out).await {
        return;
    }
    if !opts.follow {
        return;
    }
    while !render.done() {
        let ended = !live.lock().contains(&path);
        let Ok(lines) = cur.read_lines().await else {
            return;
        };
        if lines.is_empty() {
            if ended {
                return;
            }
            // Rotated under us: the rest is in the new file.
            if let Ok(m) = tokio::fs::metadata(&path).await
                && m.ino() != cur.ino
            {
                match Cursor::open(&path).await {
                    Ok(c) => cur = c,
                    Err(_) => return,
                }
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_POLL) => {}
                () = tx.closed() => return,
            }
            continue;
        }
        render.render(&lines, None, &mut out);
        if !send(&tx, &mut out).await {
            return;
        }
    }
}

/// Sends what `out` holds, if anything; false once the client has gone.
async fn send(tx: &mpsc::Sender<Bytes>, out: &mut Vec<u8>) -> bool {
    out.is_empty() || tx.send(Bytes::from(std::mem::take(out))).await.is_ok()
}

/// Serves a node's container logs, its containers' usage, exec and port-forward to the API
/// server.
#[derive(Clone)]
pub struct AgentServer {
    node: String,
    dir: PathBuf,
    tokens: Tokens,
    live: Live,
    stats: crate::usage::Stats,
    targets: crate::streams::Targets,
}

fn safe(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= 253
        && segment
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !segment.starts_with('.')
}

fn bad(message: String) -> Result<(PathBuf, LogOptions), ApiError> {
    Err(ApiError::bad_request(message))
}

impl AgentServer {
    /// Logs of node `node` under `dir` and its usage `stats`, for requests signed by
    /// `tokens`.
    pub fn new(
        node: &str,
        dir: PathBuf,
        tokens: Tokens,
        live: Live,
        stats: crate::usage::Stats,
        targets: crate::streams::Targets,
    ) -> AgentServer {
        AgentServer {
            node: node.to_owned(),
            dir,
            tokens,
            live,
            stats,
            targets,
        }
    }

    /// The node served.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Its running containers (for exec and port-forward).
    pub(crate) fn targets(&self) -> &crate::streams::Targets {
        &self.targets
    }

    /// The HTTP routes.
    pub fn router(self) -> Router {
        Router::new()
            .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
            .route("/stats/usage", get(usage))
            .route(
                "/exec/{ns}/{pod}/{container}",
                get(crate::streams::exec_route),
            )
            .route(
                "/attach/{ns}/{pod}/{container}",
                get(crate::streams::attach_route),
            )
            .route(
                "/portForward/{ns}/{pod}",
                get(crate::streams::port_forward_route),
            )
            .route("/healthz", get(|| async { "ok" }))
            .with_state(self)
    }

    /// Which file a request reads, and how.
    fn resolve(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        query: &str,
    ) -> Result<(PathBuf, LogOptions), ApiError> {
        let (params, _) = parse_params(query)?;
        let opts = params.log;
        if let Some(why) = opts.problems() {
            return bad(format!("PodLogOptions are invalid: {why}"));
        }
        let uid = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("podUID="))
            .unwrap_or_default();
        for (what, v) in [
            ("namespace", ns),
            ("pod", pod),
            ("container", container),
            ("podUID", uid),
        ] {
            if !safe(v) {
                return bad(format!("{what} {v:?} is not a valid name"));
            }
        }
        let pdir = pod_dir(&self.dir, ns, pod, uid);
        if !pdir.is_dir() {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "pod {ns}/{pod} (uid {uid}) has run nothing on node {}",
                    self.node
                ),
            ));
        }
        let current = std::fs::read_dir(pdir.join(container))
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".log")?
                    .parse::<u32>()
                    .ok()
            })
            .max();
        let Some(current) = current else {
            return bad(format!(
                "container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
            ));
        };
        let run = if opts.previous {
            let Some(p) = current.checked_sub(1) else {
                return bad(format!(
                    "previous terminated container \"{container}\" in pod \"{pod}\" not found"
                ));
            };
            p
        } else {
            current
        };
        Ok((log_path(&pdir, container, run), opts))
    }
}

/// Refuses a request that does not carry a credential the API server signed for this very
/// request (`GET` of `uri`'s path and query) to this node.
pub(crate) fn refuse_stranger(
    server: &AgentServer,
    headers: &HeaderMap,
    uri: &Uri,
) -> Option<Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if server.tokens.check_node_token(
        token.trim(),
        &server.node,
        now_secs(),
        "GET",
        uri.path_and_query().map_or(uri.path(), |p| p.as_str()),
    ) {
        return None;
    }
    Some(error_response(&ApiError::new(
        401,
        "Unauthorized",
        format!(
            "node {} serves only its API server (a node credential it signed)",
            server.node
        ),
    )))
}

async fn usage(State(server): State<AgentServer>, headers: HeaderMap, uri: Uri) -> Response {
    if let Some(refused) = refuse_stranger(&server, &headers, &uri) {
        return refused;
    }
    let report = server.stats.lock().clone();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        report.to_string(),
    )
        .into_response()
}

async fn container_logs(
    State(server): State<AgentServer>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Some(refused) = refuse_stranger(&server, &headers, &uri) {
        return refused;
    }
    let (path, opts) =
        match server.resolve(&ns, &pod, &container, query.as_deref().unwrap_or_default()) {
            Ok(r) => r,
            Err(e) => return error_response(&e),
        };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(stream_log(path, opts, server.live.clone(), tx));
    let body =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(body),
    )
        .into_response()
}

/// An error as the Kubernetes `Status` the API server relays (with `Retry-After` when the
/// error has one).
pub(crate) fn error_response(e: &ApiError) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut resp = (
        axum::http::StatusCode::from_u16(e.code)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        e.to_status().to_string(),
    )
        .into_response();
    if let Some(s) = e.retry_after
        && let Ok(v) = axum::http::HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(lines: &[(&str, &str, bool)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (ts, text, full) in lines {
            cri_line(&mut out, ts, "stdout", *full, text.as_bytes());
        }
        out
    }

    fn render(opts: LogOptions, raw: &[u8]) -> String {
        let mut out = Vec::new();
        Render::new(&opts).render(raw, opts.tail_lines, &mut out);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn lines_render_with_tail_since_timestamps_and_limits() {
        let raw = log(&[
            ("2026-11-30T10:00:00.000000001Z", "one", true),
            ("2026-11-30T10:00:01.000000000Z", "tw", false),
            ("2026-11-30T10:00:01.000000000Z", "o", true),
            ("2026-11-30T10:00:02.000000000Z", "three", true),
        ]);
        assert_eq!(render(LogOptions::default(), &raw), "one\ntwo\nthree\n");
        let tail = |n| LogOptions {
            tail_lines: Some(n),
            ..LogOptions::default()
        };
        assert_eq!(render(tail(2), &raw), "two\nthree\n");
        assert_eq!(render(tail(1), &raw), "three\n");
        assert_eq!(render(tail(0), &raw), "");
        assert_eq!(render(tail(9), &raw), "one\ntwo\nthree\n");
        let since = LogOptions {
            since_time: Some("2026-11-30T10:00:01Z".into()),
            ..LogOptions::default()
        };
        assert_eq!(render(since, &raw), "two\nthree\n");
        let stamped = LogOptions {
            timestamps: true,
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(
            render(stamped, &raw),
            "2026-11-30T10:00:01.000000000Z two\n2026-11-30T10:00:02.000000000Z three\n"
        );
        let limited = LogOptions {
            limit_bytes: Some(6),
            ..LogOptions::default()
        };
        assert_eq!(render(limited, &raw), "one\ntw");
        // A line that is not CRI (a torn write) is skipped, not served as garbage.
        let mut torn = raw.clone();
        torn.extend_from_slice(b"garbage\n");
        assert_eq!(render(LogOptions::default(), &torn), "one\ntwo\nthree\n");
    }

    #[tokio::test]
    async fn pumps_split_long_lines_and_files_rotate() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c/0.log");
        let file = Arc::new(Mutex::new(LogFile::create(&path, 64 * 1024).expect("log")));
        let long = "x".repeat(MAX_LINE + 10);
        let input = format!("hello\n{long}\nno newline at the end");
        pump(input.as_bytes(), "stdout", file.clone(), None).await;
        let raw = std::fs::read(&path).expect("read");
        let tags: Vec<&[u8]> = raw
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| l.splitn(4, |&b| b == b' ').nth(2).expect("tag"))
            .collect();
        assert_eq!(tags, [&b"F"[..], b"P", b"F", b"F"]);
        assert_eq!(
            render(LogOptions::default(), &raw),
            format!("hello\n{long}\nno newline at the end\n")
        );
        // Past the limit the file rotates once: the old lines move to .1.
        let small = Arc::new(Mutex::new(
            LogFile::create(&dir.path().join("d/0.log"), 200).expect("log"),
        ));
        let lines: String = (0..20).map(|i| format!("line {i}\n")).collect();
        pump(lines.as_bytes(), "stdout", small, None).await;
        assert!(dir.path().join("d/0.log.1").exists());
        assert!(
            std::fs::metadata(dir.path().join("d/0.log"))
                .expect("meta")
                .len()
                <= 200
        );
    }
}
