//! How records, counters and listing cursors are named in Redis.

use super::*;

/// What follows the prefix in a failure counter's key.
pub(super) const FAILURES: &str = "\\failures";

/// `<prefix><kind>:<tenant>:<key>`, with `\` and `:` inside the tenant and key escaped; on a
/// cluster `<prefix><kind>:{<tenant>:<key>}`, with `{` and `}` also escaped (as `\(` and `\)`),
/// so the hash tag is exactly the tenant and key: never cut short by a `}` in them, never empty
/// (it holds at least the `:`), the same for a record and its counter.
pub(super) fn escaped(prefix: &str, kind: &str, key: &RecordKey, layout: Layout) -> String {
    let mut out =
        String::with_capacity(prefix.len() + kind.len() + key.tenant.len() + key.key.len() + 4);
    out.push_str(prefix);
    out.push_str(kind);
    out.push(':');
    if layout == Layout::Cluster {
        out.push('{');
    }
    push_escaped(&mut out, &key.tenant, layout);
    out.push(':');
    push_escaped(&mut out, &key.key, layout);
    if layout == Layout::Cluster {
        out.push('}');
    }
    out
}

/// The record key `redis_key` spells under `prefix`, as [`escaped`] writes it, or `None` for a
/// key that is not a record of that prefix.
pub(super) fn unescaped(prefix: &str, layout: Layout, redis_key: &[u8]) -> Option<RecordKey> {
    let text = std::str::from_utf8(redis_key).ok()?;
    let mut rest = text.strip_prefix(prefix)?.strip_prefix(':')?;
    if layout == Layout::Cluster {
        rest = rest.strip_prefix('{')?.strip_suffix('}')?;
    }
    let (mut parts, mut part, mut escaped) = (Vec::new(), String::new(), false);
    for c in rest.chars() {
        match c {
            _ if escaped => {
                part.push(layout.unescape(c)?);
                escaped = false;
            }
            '\\' => escaped = true,
            ':' => parts.push(std::mem::take(&mut part)),
            '{' | '}' if layout == Layout::Cluster => return None,
            _ => part.push(c),
        }
    }
    parts.push(part);
    match <[String; 2]>::try_from(parts) {
        Ok([tenant, key]) if !escaped => Some(RecordKey::new(tenant, key)),
        _ => None,
    }
}

/// What every record key of `tenant` starts with: `<prefix>:<tenant>:` (on a cluster
/// `<prefix>:{<tenant>:`).
pub(super) fn tenant_prefix(prefix: &str, tenant: &str, layout: Layout) -> String {
    let mut out = format!("{prefix}:");
    if layout == Layout::Cluster {
        out.push('{');
    }
    push_escaped(&mut out, tenant, layout);
    out.push(':');
    out
}

pub(super) fn push_escaped(out: &mut String, part: &str, layout: Layout) {
    for c in part.chars() {
        match (c, layout) {
            ('\\' | ':', _) => {
                out.push('\\');
                out.push(c);
            }
            ('{', Layout::Cluster) => out.push_str("\\("),
            ('}', Layout::Cluster) => out.push_str("\\)"),
            _ => out.push(c),
        }
    }
}

impl Layout {
    /// The character an escape `\<c>` stands for. On a cluster, only what [`push_escaped`]
    /// writes: any other escape is not a key of the store's.
    fn unescape(self, c: char) -> Option<char> {
        match (self, c) {
            (Layout::Standalone, _) => Some(c),
            (Layout::Cluster, '\\' | ':') => Some(c),
            (Layout::Cluster, '(') => Some('{'),
            (Layout::Cluster, ')') => Some('}'),
            (Layout::Cluster, _) => None,
        }
    }
}

/// Where a walk over the store's keys stands: a server's `SCAN` cursor, or on a cluster a
/// shard's (named by its lowest slot) and the `SCAN` cursor on its primary. Spelled `<cursor>`
/// and `<slot>:<cursor>` in a listing's [`Cursor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Position {
    Server(u64),
    Shard { slot: u16, cursor: u64 },
}

impl Position {
    pub(super) fn cursor(self) -> u64 {
        match self {
            Position::Server(cursor) | Position::Shard { cursor, .. } => cursor,
        }
    }

    pub(super) fn parse(text: &str, layout: Layout) -> Option<Position> {
        match layout {
            Layout::Standalone => text.parse().ok().map(Position::Server),
            Layout::Cluster => {
                let (slot, cursor) = text.split_once(':')?;
                let slot: u16 = slot.parse().ok()?;
                Slot::new(slot)?;
                Some(Position::Shard {
                    slot,
                    cursor: cursor.parse().ok()?,
                })
            }
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Server(cursor) => write!(f, "{cursor}"),
            Position::Shard { slot, cursor } => write!(f, "{slot}:{cursor}"),
        }
    }
}

pub(super) fn not_a_cursor(text: &str) -> StoreError {
    StoreError::Config(format!("not a cursor of this store: {text:?}"))
}

/// The lowest slot of each primary in a `CLUSTER SLOTS` reply (`[[start, end, [host, port,
/// id, ..], replicas..], ..]`), in order.
pub(super) fn parse_shards(reply: Value) -> Result<Vec<u16>, StoreError> {
    let bad = |why: &str| StoreError::Unavailable(format!("redis: CLUSTER SLOTS: {why}"));
    let ranges: Vec<Vec<Value>> =
        redis::from_redis_value(reply).map_err(|e| bad(&e.to_string()))?;
    let mut lowest: HashMap<(String, i64), u16> = HashMap::new();
    for range in ranges {
        let mut fields = range.into_iter();
        let (Some(start), Some(_end), Some(primary)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad("a range has no primary"));
        };
        let start: u16 = redis::from_redis_value(start).map_err(|e| bad(&e.to_string()))?;
        let primary: Vec<Value> =
            redis::from_redis_value(primary).map_err(|e| bad(&e.to_string()))?;
        let mut node = primary.into_iter();
        let (Some(host), Some(port)) = (node.next(), node.next()) else {
            return Err(bad("a primary has no address"));
        };
        let address: (String, i64) = (
            redis::from_redis_value(host).map_err(|e| bad(&e.to_string()))?,
            redis::from_redis_value(port).map_err(|e| bad(&e.to_string()))?,
        );
        let slot = lowest.entry(address).or_insert(start);
        *slot = (*slot).min(start);
    }
    let mut shards: Vec<u16> = lowest.into_values().collect();
    shards.sort_unstable();
    Ok(shards)
}

/// `text` with the characters `SCAN MATCH` treats as a pattern escaped.
pub(super) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
