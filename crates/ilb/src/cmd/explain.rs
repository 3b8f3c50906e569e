//! `ilb explain --control-plane URL --cluster C --model M`: why each weight of one cluster and
//! model is what it is, as a table (from the control plane's `/v1/explain/weights`).

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Control plane base URL, e.g. http://127.0.0.1:7000.
    #[arg(long, value_name = "URL")]
    control_plane: String,
    #[arg(long)]
    cluster: String,
    #[arg(long)]
    model: String,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ExplainArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("cluster", &args.cluster)
        .append_pair("model", &args.model)
        .finish();
    let url = format!("{}/v1/explain/weights?{query}", args.control_plane.trim_end_matches('/'));
    let (status, body) = runtime.block_on(fetch(&url)).with_context(|| format!("cannot reach {url}"))?;
    let value: Value = serde_json::from_slice(&body).with_context(|| format!("{url} did not answer JSON"))?;
    if !status.is_success() {
        bail!("{}", value["error"]["message"].as_str().unwrap_or("the control plane refused the request"));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", table(&value));
    }
    Ok(())
}

async fn fetch(url: &str) -> anyhow::Result<(http::StatusCode, Bytes)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response =
        tokio::time::timeout(std::time::Duration::from_secs(10), client.get(url.parse()?)).await??;
    let status = response.status();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Renders the explanation as plain text.
pub fn table(v: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "cluster {}  model {}  snapshot {}\nsolve {:.2} ms  certified gap {:.4} %  expected mean latency {:.1} ms  traffic moved {}\n",
        v["cluster"].as_str().unwrap_or("?"),
        v["model"].as_str().unwrap_or("?"),
        v["version"],
        num(&v["solve_ms"]),
        num(&v["gap"]) * 100.0,
        num(&v["mean_latency_ms"]),
        v["traffic_moved"].as_f64().map_or("-".into(), |m| format!("{:.2} %", m * 100.0)),
    ));
    let engines: Vec<&Value> = v["engines"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
    let engine = |id: &str| engines.iter().find(|e| e["id"] == id).copied();
    for class in v["classes"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nclass {}  demand {:.1} req/s  shed {:.1} req/s{}\n",
            class["class"].as_str().unwrap_or("?"),
            num(&class["measured_demand_rps"]),
            num(&class["shed_rps"]),
            class["residency"].as_str().map(|r| format!("  residency {r}")).unwrap_or_default(),
        ));
        out.push_str(&format!(
            "  {:<16} {:>7} {:>8} {:>9} {:>10} {:>9} {:>10} {:>14} {:>8}\n",
            "engine", "weight", "req/s", "network", "engine", "e2e", "price", "load/capacity", "penalty"
        ));
        let mut routes: Vec<&Value> =
            class["routes"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
        routes.sort_by(|a, b| num(&b["weight"]).total_cmp(&num(&a["weight"])));
        for r in routes {
            let id = r["engine"].as_str().unwrap_or("?");
            let e = engine(id);
            let field = |name: &str| e.map_or(f64::NAN, |e| num(&e[name]));
            let binds = e.and_then(|e| e["capacity_binds"].as_bool()).unwrap_or(false);
            out.push_str(&format!(
                "  {:<16} {:>6.1}% {:>8.1} {:>6.1} ms {:>7.1} ms {:>6.1} ms {:>7.1} ms {:>6.1}/{:<6.1}{} {:>7.0}%\n",
                id,
                num(&r["weight"]) * 100.0,
                num(&r["rps"]),
                num(&r["network_ms"]),
                num(&r["engine_latency_ms"]),
                num(&r["end_to_end_ms"]),
                field("marginal_price_ms"),
                field("planned_load_rps"),
                field("effective_capacity_rps"),
                if binds { "*" } else { " " },
                field("penalty") * 100.0,
            ));
        }
    }
    out.push_str(
        "\n* capacity binds: the engine is planned at its usable capacity (rho × effective capacity).\n",
    );
    out.push_str("A class sends traffic to an engine while network + marginal engine cost there is the lowest it can get;\nprice is the marginal cost of one more req/s at the engine.\n");
    out
}
