//! `toolkey approvals`: list what waits for a person, show one request, approve or deny it.
//!
//! ```text
//! toolkey --store sqlite:toolkey.db approvals list --tenant acme
//! toolkey --store sqlite:toolkey.db approvals approve --tenant acme --tool refund \
//!     --key refund:o-1 --revision 1 --by ops@example.com --reason "customer called"
//! ```
//!
//! A decision names the revision `list` or `show` printed, and is refused when that is not the
//! latest request of its key, was decided already, or expired: nothing here decides a request
//! nobody looked at.

use super::*;
use toolkey::admin::DecisionRefused;
use toolkey::store::{Approval, ApprovalKey, ApprovalStatus};

#[derive(Debug, Args)]
pub(crate) struct ApprovalsArgs {
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(Debug, Subcommand)]
enum ApprovalsCommand {
    /// Lists a tenant's requests that wait for a decision (every request with `--all`).
    List(ApprovalListArgs),
    /// Shows the latest request of a tool and key, with its arguments and decision.
    Show(RequestArgs),
    /// Approves a pending request: the model's next call with the same arguments runs, once.
    Approve(DecideArgs),
    /// Denies a pending request: the call with those arguments never runs.
    Deny(DecideArgs),
}

#[derive(Debug, Args)]
struct ApprovalListArgs {
    /// The tenant (empty when calls set none).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    tenant: String,
    /// Every request, decided, expired and used ones too, every revision.
    #[arg(long)]
    all: bool,
    /// At most this many requests.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

#[derive(Debug, Args)]
struct RequestArgs {
    /// The request's tenant (empty when calls set none).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    tenant: String,
    /// The tool.
    #[arg(long)]
    tool: String,
    /// The key, as `list` prints it (a value that starts with `-` is still the key).
    #[arg(long, allow_hyphen_values = true)]
    key: String,
}

#[derive(Debug, Args)]
struct DecideArgs {
    #[command(flatten)]
    request: RequestArgs,
    /// The revision `list` or `show` printed.
    #[arg(long)]
    revision: u64,
    /// Who decides, as the record keeps it.
    #[arg(long)]
    by: String,
    /// Why, kept with the decision.
    #[arg(long)]
    reason: Option<String>,
}

pub(crate) async fn execute(
    args: ApprovalsArgs,
    admin: &Admin,
    store: &Arc<dyn Store>,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit, Failure> {
    let now = store.now().await?;
    match args.command {
        ApprovalsCommand::List(args) => {
            let requests = match args.all {
                true => admin.approvals(&args.tenant, None, args.limit).await?,
                false => admin.pending(&args.tenant, args.limit).await?,
            };
            if as_json {
                let rows: Vec<Value> = requests.iter().map(|r| request_json(r, now)).collect();
                writeln!(out, "{}", Value::Array(rows))?;
            } else {
                let mut table = table(["TOOL", "KEY", "REVISION", "STATUS", "ASKED", "EXPIRES"]);
                for r in &requests {
                    table.add_row([
                        r.id.tool.clone(),
                        r.id.key.clone(),
                        r.revision.to_string(),
                        r.status(now).to_string(),
                        ago(now, r.requested_at),
                        ago(now, r.expires_at),
                    ]);
                }
                writeln!(out, "{table}")?;
            }
            Ok(Exit::Done)
        }
        ApprovalsCommand::Show(args) => {
            let id = ApprovalKey::new(args.tenant, args.tool, args.key);
            match admin.approval(&id).await? {
                Some(r) if as_json => writeln!(out, "{}", request_json(&r, now))?,
                Some(r) => write_request(out, &r, now)?,
                None if as_json => {
                    writeln!(out, "null")?;
                    return Ok(Exit::NotFound);
                }
                None => {
                    writeln!(
                        out,
                        "no approval request (tenant {}, tool {}, key {})",
                        word(&id.tenant),
                        word(&id.tool),
                        word(&id.key)
                    )?;
                    return Ok(Exit::NotFound);
                }
            }
            Ok(Exit::Done)
        }
        ApprovalsCommand::Approve(args) => decide(args, true, admin, as_json, out).await,
        ApprovalsCommand::Deny(args) => decide(args, false, admin, as_json, out).await,
    }
}

async fn decide(
    args: DecideArgs,
    approved: bool,
    admin: &Admin,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit, Failure> {
    let id = ApprovalKey::new(args.request.tenant, args.request.tool, args.request.key);
    let reason = args.reason.as_deref();
    let decided = match approved {
        true => admin.approve(&id, args.revision, &args.by, reason).await,
        false => admin.deny(&id, args.revision, &args.by, reason).await,
    };
    let word = if approved { "approved" } else { "denied" };
    match decided {
        Ok(request) if as_json => {
            let now = request
                .decision
                .as_ref()
                .map_or(request.requested_at, |d| d.at);
            writeln!(out, "{}", json!({"decided": request_json(&request, now)}))?;
            Ok(Exit::Done)
        }
        Ok(request) => {
            let next = match approved {
                true => "the model's next call with the same arguments runs it, once",
                false => "the call with those arguments never runs",
            };
            writeln!(out, "{word} request {}: {next}", request.revision)?;
            Ok(Exit::Done)
        }
        Err(DecisionRefused::Store(e)) => Err(Failure::Store(e)),
        Err(refused) => {
            if as_json {
                writeln!(out, "{}", json!({"refused": refused.to_string()}))?;
            } else {
                writeln!(out, "refused, nothing changed: {refused}")?;
            }
            Ok(match refused {
                DecisionRefused::NotFound { .. } => Exit::NotFound,
                _ => Exit::Refused,
            })
        }
    }
}

fn write_request(out: &mut dyn Write, r: &Approval, now: SystemTime) -> std::io::Result<()> {
    writeln!(out, "tenant:      {}", word(&r.id.tenant))?;
    writeln!(out, "tool:        {}", r.id.tool)?;
    writeln!(out, "key:         {}", word(&r.id.key))?;
    writeln!(out, "revision:    {}", r.revision)?;
    writeln!(out, "status:      {}", r.status(now))?;
    writeln!(out, "arguments:   {}", r.arguments)?;
    writeln!(out, "fingerprint: {}", r.fingerprint)?;
    let by = match &r.requested_by.principal {
        Some(principal) => format!("run {} ({principal})", r.requested_by.run_id),
        None => format!("run {}", r.requested_by.run_id),
    };
    writeln!(out, "asked by:    {by}, {}", ago(now, r.requested_at))?;
    writeln!(
        out,
        "expires:     {} ({})",
        time(r.expires_at),
        ago(now, r.expires_at)
    )?;
    if let Some(d) = &r.decision {
        let what = if d.approved { "approved" } else { "denied" };
        writeln!(out, "decision:    {what} by {} at {}", d.by, time(d.at))?;
        if let Some(reason) = &d.reason {
            writeln!(out, "reason:      {reason}")?;
        }
    }
    if let Some(used) = r.used_at {
        writeln!(out, "used:        {}", time(used))?;
    }
    if r.status(now) == ApprovalStatus::Pending {
        writeln!(
            out,
            "decide:      toolkey approvals approve --tenant={} --tool={} --key={} --revision={} --by=<you>",
            word(&r.id.tenant),
            r.id.tool,
            word(&r.id.key),
            r.revision
        )?;
    }
    Ok(())
}

fn request_json(r: &Approval, now: SystemTime) -> Value {
    let mut value = serde_json::to_value(r).expect("a request serializes");
    value["status"] = json!(r.status(now).to_string());
    value
}
