//! Approval requests: one hash per (tenant, tool, key), holding every revision.
//!
//! `<prefix>\approvals:<tenant>:<tool>\:<key>` (on a cluster `<prefix>\approvals:{<tenant>:<tool>\:<key>}`)
//! holds `latest` (the latest revision), and per revision `s:<n>` (its state) and `d:<n>` (the
//! request as JSON). No record key or counter key spells it, and `SCAN <prefix>:*` never
//! meets it. Its TTL is the latest retention any of its revisions asked for.

use super::*;
use crate::store::{listed_after, Approval, ApprovalKey, ApprovalState, Approvals};

const APPROVALS: &str = "\\approvals";

static LATEST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local r = redis.call('HGET', KEYS[1], 'latest')
if not r then return false end
return redis.call('HGET', KEYS[1], 'd:' .. r)
"#,
    )
});

/// Writes revision ARGV[1] (state ARGV[2], request ARGV[3]) only while the latest is the one
/// before it, and keeps the hash at least ARGV[4] ms.
static OPEN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local latest = tonumber(redis.call('HGET', KEYS[1], 'latest') or '0')
if latest + 1 ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'latest', ARGV[1], 's:' .. ARGV[1], ARGV[2], 'd:' .. ARGV[1], ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
"#,
    )
});

/// Replaces revision ARGV[1] with state ARGV[2] and request ARGV[3] only while its state is
/// ARGV[4], and keeps the hash at least ARGV[5] ms.
static UPDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HGET', KEYS[1], 's:' .. ARGV[1]) ~= ARGV[4] then return 0 end
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], ARGV[2], 'd:' .. ARGV[1], ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[5]) then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
return 1
"#,
    )
});

impl RedisStore {
    fn approval_key(&self, id: &ApprovalKey) -> String {
        // The tool's length first: a name an operator typed may hold `:`, and `a:b` + `c` must
        // not read the hash of `a` + `b:c`.
        let joined = format!("{}:{}:{}", id.tool.len(), id.tool, id.key);
        let key = RecordKey::new(id.tenant.as_str(), joined);
        escaped(&self.prefix, APPROVALS, &key, self.layout)
    }
}

/// How long the store keeps `request`: until its `retain_until`, at least a millisecond.
fn keep_ms(request: &Approval) -> String {
    let left = request
        .retain_until
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    span_ms(left).max(1).to_string()
}

#[async_trait]
impl Approvals for RedisStore {
    async fn latest_approval(&self, id: &ApprovalKey) -> Result<Option<Approval>, StoreError> {
        let text: Option<String> = self
            .eval(&LATEST, &[self.approval_key(id)], &[], false)
            .await?;
        text.as_deref().map(Approval::from_stored).transpose()
    }

    async fn open_approval(&self, request: &Approval) -> Result<bool, StoreError> {
        let revision = request.revision.to_string();
        let written: i64 = self
            .eval(
                &OPEN,
                &[self.approval_key(&request.id)],
                &[
                    &revision,
                    request.state.as_str(),
                    &request.to_stored(),
                    &keep_ms(request),
                ],
                true,
            )
            .await?;
        Ok(written == 1)
    }

    async fn update_approval(
        &self,
        request: &Approval,
        seen: ApprovalState,
    ) -> Result<bool, StoreError> {
        let revision = request.revision.to_string();
        let written: i64 = self
            .eval(
                &UPDATE,
                &[self.approval_key(&request.id)],
                &[
                    &revision,
                    request.state.as_str(),
                    &request.to_stored(),
                    seen.as_str(),
                    &keep_ms(request),
                ],
                true,
            )
            .await?;
        Ok(written == 1)
    }

    /// Walks the tenant's approval hashes with `SCAN` to the end (on a cluster, every shard),
    /// reads each, and orders the requests as every store lists them. A person's queue of
    /// requests is short; each page reads all of it.
    async fn list_approvals(
        &self,
        tenant: &str,
        state: Option<ApprovalState>,
        after: Option<(&ApprovalKey, u64)>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let prefix = format!("{}{APPROVALS}", self.prefix);
        let pattern = format!(
            "{}*",
            glob_escape(&tenant_prefix(&prefix, tenant, self.layout))
        );
        let (mut at, shards) = self.start().await?;
        let mut keys = Vec::new();
        while let Some(position) = at {
            let (next, step) = self.scan(position, &shards, &pattern, 500).await?;
            keys.extend(step);
            at = next;
        }
        keys.sort_unstable();
        keys.dedup();
        let mut found = Vec::new();
        for key in keys {
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(unavailable)?;
            for (field, text) in fields {
                if field.starts_with("d:") {
                    let request = Approval::from_stored(&text)?;
                    if request.id.tenant == tenant {
                        found.push(request);
                    }
                }
            }
        }
        found.retain(|request| {
            state.is_none_or(|state| request.state == state) && listed_after(request, after)
        });
        found.sort_by(|a, b| (&a.id, a.revision).cmp(&(&b.id, b.revision)));
        found.truncate(limit);
        Ok(found)
    }
}
