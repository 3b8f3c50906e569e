//! The one TOML config file, split into the sections of the library crates, which
//! deserialize them (`deny_unknown_fields`) and validate them into their typed configs before
//! any port is bound, with errors that name the field: `[data_plane]` into
//! `ilb_dataplane::config::DataPlaneSection`, the fleet tables into
//! `ilb_planning::FleetConfig`. The TLS tables name certificate files, which only this
//! binary reads: they are taken out here (`crate::tls`).

use anyhow::Context;
use ilb_dataplane::config::DataPlaneSection;
use std::path::Path;

/// The whole file: a `[data_plane]` table for `ilb data-plane`, and the fleet description
/// (`[control_plane]`, `[[regions]]`, `[network]`, `[[clusters]]`, `[[classes]]`,
/// `[profiles.NAME]`, `[[engines]]`) for `ilb control-plane`; see
/// `ilb_dataplane::config::DataPlaneSection` and `ilb_planning::config::FleetConfig` for
/// those tables' fields.
#[derive(Debug, Default)]
pub struct ConfigFile {
    pub data_plane: Option<DataPlaneSection>,
    /// `[data_plane.tls]`, `[data_plane.engine_tls]` and `[data_plane.control_plane_tls]`.
    pub data_plane_tls: DataPlaneTls,
    pub fleet: Option<ilb_planning::FleetConfig>,
    /// `[control_plane.tls]`: TLS on the control plane's API and dashboard listener (`cert`,
    /// `key`, both watched; `client_ca` and `client_auth` to verify data planes' certificates).
    pub control_plane_tls: crate::tls::ListenerTlsSection,
    /// `[control_plane.engine_tls]`: trust for https engines' `/metrics` (`ca`, `ca_only`) and a
    /// client certificate if they ask for one (`cert`, `key`).
    pub control_plane_engine_tls: crate::tls::ClientTlsSection,
    /// `[control_plane.etcd]`: the replicas' leader election (`--etcd`).
    pub control_plane_etcd: EtcdSection,
}

/// `[control_plane.etcd]`: with endpoints, the control-plane replicas sharing `prefix` elect one
/// planner on an etcd lease; only it plans what is published, and every replica publishes its
/// plans under versions ordered by its term (`ilb_controlplane`'s `election.rs`). Without, every
/// replica plans on its own and versions are wall-clock milliseconds.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSection {
    /// etcd endpoints, e.g. `["http://10.0.0.5:2379"]` (flag `--etcd`, repeatable; plain http only).
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Key prefix of the election and the published rounds; default `/ilb/control-plane`.
    pub prefix: Option<String>,
    /// Lease time to live, s: how long a dead leader keeps the role; default 2 (at least 1).
    pub lease_ttl_s: Option<u64>,
    /// This replica's name in the election; default its listen address and process id.
    pub name: Option<String>,
}

impl EtcdSection {
    /// `None` without endpoints.
    pub fn validate(
        self,
        listen: std::net::SocketAddr,
    ) -> anyhow::Result<Option<ilb_controlplane::EtcdOptions>> {
        if self.endpoints.is_empty() {
            return Ok(None);
        }
        for url in &self.endpoints {
            // The etcd client is built without TLS (its `tls` feature would add a second
            // rustls set-up); an https endpoint is refused rather than failing at connect.
            if !url.starts_with("http://") {
                anyhow::bail!("control_plane.etcd.endpoints: '{url}' is not an http:// URL (TLS to etcd is not supported yet)");
            }
        }
        let ttl = self.lease_ttl_s.unwrap_or(2);
        if !(1..=3600).contains(&ttl) {
            anyhow::bail!("control_plane.etcd.lease_ttl_s: must be between 1 and 3600");
        }
        let prefix = self.prefix.unwrap_or_else(|| "/ilb/control-plane".into());
        if prefix.is_empty() {
            anyhow::bail!("control_plane.etcd.prefix: must not be empty");
        }
        Ok(Some(ilb_controlplane::EtcdOptions {
            endpoints: self.endpoints,
            prefix: prefix.trim_end_matches('/').to_owned(),
            lease_ttl: std::time::Duration::from_secs(ttl),
            name: self.name.unwrap_or_else(|| format!("{listen}-{}", std::process::id())),
        }))
    }
}

/// The TLS tables of `[data_plane]`: they name certificate files, which only the binary reads.
#[derive(Debug, Default)]
pub struct DataPlaneTls {
    /// `[data_plane.tls]`: terminate TLS on the client listener (`cert`, `key`; both watched
    /// and reloaded when they change).
    pub tls: crate::tls::ListenerTlsSection,
    /// `[data_plane.engine_tls]`: trust for https engines (`ca`, `ca_only`) and a client
    /// certificate if engines ask for one (`cert`, `key`).
    pub engine_tls: crate::tls::ClientTlsSection,
    /// `[data_plane.control_plane_tls]`: trust for an https control plane (`ca`, `ca_only`) and
    /// the client certificate it verifies (`cert`, `key`: mutual TLS).
    pub control_plane_tls: crate::tls::ClientTlsSection,
}

pub fn load(path: &Path) -> anyhow::Result<ConfigFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
    parse(&text).with_context(|| format!("invalid config {}", path.display()))
}

/// Parses the file into its sections; each is checked with its field names in errors.
///
/// Errors name the field or the line and column, never quote the file's text, and pass
/// through `ilb_core::redact`: a typo on the `token` line must not publish the token in the
/// control plane's state page or the log.
pub fn parse(text: &str) -> anyhow::Result<ConfigFile> {
    sections(text).map_err(|e| {
        anyhow::anyhow!(ilb_core::redact::message(&format!("{e:#}"), &ilb_core::redact::secret_values(text)))
    })
}

/// A TOML syntax error as its position and message, without the quoted line that the
/// `toml` crate's own message carries.
fn syntax_error(e: &toml::de::Error, text: &str) -> anyhow::Error {
    let Some(span) = e.span() else { return anyhow::anyhow!("{}", e.message()) };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    anyhow::anyhow!("line {line}, column {column}: {}", e.message().trim_end())
}

fn sections(text: &str) -> anyhow::Result<ConfigFile> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(&e, text))?;
    // The TLS tables name files, which only the binary reads: taken out here, before the
    // data plane's table goes to its crate and the fleet tables to the control plane's.
    let mut data_plane_tls = DataPlaneTls::default();
    let data_plane = match table.remove("data_plane") {
        Some(mut v) => {
            if let toml::Value::Table(dp) = &mut v {
                if let Some(t) = dp.remove("tls") {
                    data_plane_tls.tls = t.try_into().context("in [data_plane.tls]")?;
                }
                if let Some(t) = dp.remove("engine_tls") {
                    data_plane_tls.engine_tls = t.try_into().context("in [data_plane.engine_tls]")?;
                }
                if let Some(t) = dp.remove("control_plane_tls") {
                    data_plane_tls.control_plane_tls =
                        t.try_into().context("in [data_plane.control_plane_tls]")?;
                }
            }
            Some(v.try_into::<DataPlaneSection>().context("in [data_plane]")?)
        }
        None => None,
    };
    let mut control_plane_tls = crate::tls::ListenerTlsSection::default();
    let mut control_plane_engine_tls = crate::tls::ClientTlsSection::default();
    let mut control_plane_etcd = EtcdSection::default();
    if let Some(toml::Value::Table(cp)) = table.get_mut("control_plane") {
        if let Some(v) = cp.remove("tls") {
            control_plane_tls = v.try_into().context("in [control_plane.tls]")?;
        }
        if let Some(v) = cp.remove("engine_tls") {
            control_plane_engine_tls = v.try_into().context("in [control_plane.engine_tls]")?;
        }
        if let Some(v) = cp.remove("etcd") {
            control_plane_etcd = v.try_into().context("in [control_plane.etcd]")?;
        }
    }
    let fleet = if table.is_empty() {
        None
    } else {
        let fleet: ilb_planning::FleetConfig = toml::Value::Table(table).try_into()?;
        fleet.validate()?;
        Some(fleet)
    };
    Ok(ConfigFile {
        data_plane,
        data_plane_tls,
        fleet,
        control_plane_tls,
        control_plane_engine_tls,
        control_plane_etcd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLEET: &str = r#"
[control_plane]
token = "live-token-0123456789"

[[clusters]]
id = "a"
region = "r"

[profiles.p]
capacity_rps = 10
ttft_t0_ms = 100
ttft_b_ms = 10

[[engines]]
id = "e"
url = "http://127.0.0.1:9000"
region = "r"
profile = "p"
model = "m"
"#;

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).expect_err("the config is refused"))
    }

    #[test]
    fn errors_give_the_position_and_never_a_secret() {
        assert!(parse(FLEET).is_ok());
        // A dropped closing quote: the reason names the line, not its text.
        let typo = FLEET.replace("0123456789\"", "0123456789");
        let reason = error(&typo);
        assert!(reason.starts_with("line 3, column "), "{reason}");
        assert!(!reason.contains("0123456789"), "{reason}");
        // A value of the wrong type elsewhere in a file that holds a token.
        let reason = error(&FLEET.replace("capacity_rps = 10", "capacity_rps = \"live-token-0123456789\""));
        assert!(reason.contains("capacity_rps") && !reason.contains("0123456789"), "{reason}");
        // Credentials in an engine's URL.
        let reason = error(&FLEET.replace("http://127.0.0.1", "http://admin:hunter22@127.0.0.1"));
        assert!(reason.contains("engines.e.url") && !reason.contains("hunter22"), "{reason}");
    }

    #[test]
    fn the_etcd_table_is_taken_out_and_checked() {
        let listen = "127.0.0.1:7000".parse().unwrap();
        let with = |table: &str| parse(&format!("{FLEET}\n[control_plane.etcd]\n{table}\n"));
        let file = with("endpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl_s = 3").expect("valid");
        let options = file.control_plane_etcd.validate(listen).unwrap().expect("etcd configured");
        assert_eq!(options.prefix, "/ilb/control-plane");
        assert_eq!(options.lease_ttl, std::time::Duration::from_secs(3));
        assert!(
            parse(FLEET).unwrap().control_plane_etcd.validate(listen).unwrap().is_none(),
            "off by default"
        );
        for (table, reason) in [
            ("endpoints = [\"etcd:2379\"]", "control_plane.etcd.endpoints"),
            ("endpoints = [\"http://e:2379\"]\nlease_ttl_s = 0", "control_plane.etcd.lease_ttl_s"),
        ] {
            let error = with(table).unwrap().control_plane_etcd.validate(listen).expect_err(table);
            assert!(error.to_string().contains(reason), "{error}");
        }
        assert!(
            error(&format!("{FLEET}\n[control_plane.etcd]\nendpoint = []\n")).contains("control_plane.etcd")
        );
    }
}
