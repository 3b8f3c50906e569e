//! Discovery by DNS with `hickory-resolver`: a group's name is looked up for A and AAAA
//! records (each address with the group's port), or for SRV records (each target's A/AAAA
//! addresses with the record's port). Nothing is cached between lookups, so every
//! resolution sees the records as they are now; "no such name" and "no records" are answers
//! (no engines), anything else (a timeout, a refused query) is a failed listing.

use super::Resolve;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;
use ilb_planning::config::EngineGroup;
use std::net::SocketAddr;
use std::time::Duration;

pub struct DnsSource {
    resolver: Result<TokioResolver, String>,
    name: String,
    port: Option<u16>,
    srv: bool,
}

impl DnsSource {
    /// A source for `group` (which passed validation), asking its nameservers or the system's.
    pub fn new(group: &EngineGroup) -> DnsSource {
        DnsSource {
            resolver: resolver(&group.nameservers).map_err(|e| format!("cannot build a dns resolver: {e}")),
            name: group.dns.clone(),
            port: group.port,
            srv: group.srv,
        }
    }
}

fn resolver(nameservers: &[String]) -> Result<TokioResolver, NetError> {
    let provider = TokioRuntimeProvider::default();
    // The one file a library reads (ARCHITECTURE.md, `ilb-controlplane`): with no nameservers
    // configured, hickory reads the system's (/etc/resolv.conf) each time a group's resolver is
    // built, as the system resolver would.
    #[allow(clippy::disallowed_methods)]
    let mut builder = if nameservers.is_empty() {
        TokioResolver::builder(provider)?
    } else {
        let mut config = ResolverConfig::from_parts(None, Vec::new(), Vec::new());
        for ns in nameservers.iter().filter_map(|ns| ns.parse::<SocketAddr>().ok()) {
            let mut server = NameServerConfig::udp_and_tcp(ns.ip());
            for connection in &mut server.connections {
                connection.port = ns.port();
            }
            config.add_name_server(server);
        }
        TokioResolver::builder_with_config(config, provider)
    };
    let options: &mut ResolverOpts = builder.options_mut();
    options.cache_size = 0;
    options.positive_max_ttl = Some(Duration::ZERO);
    options.negative_max_ttl = Some(Duration::ZERO);
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    options.timeout = Duration::from_secs(2);
    options.attempts = 2;
    builder.build()
}

/// "No such name" and "no records of that type" are answers: the group has no engines.
fn no_records(error: &NetError) -> bool {
    error.is_no_records_found() || error.is_nx_domain()
}

impl DnsSource {
    async fn addresses(resolver: &TokioResolver, name: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        match resolver.lookup_ip(name).await {
            Ok(ips) => Ok(ips.iter().map(|ip| SocketAddr::new(ip, port)).collect()),
            Err(e) if no_records(&e) => Ok(Vec::new()),
            Err(e) => Err(format!("lookup of {name}: {e}")),
        }
    }
}

impl Resolve for DnsSource {
    async fn resolve(&mut self) -> Result<Vec<SocketAddr>, String> {
        let resolver = self.resolver.as_ref().map_err(Clone::clone)?;
        let mut found = Vec::new();
        if self.srv {
            let records = match resolver.srv_lookup(self.name.as_str()).await {
                Ok(lookup) => lookup.answers().to_vec(),
                Err(e) if no_records(&e) => Vec::new(),
                Err(e) => return Err(format!("srv lookup of {}: {e}", self.name)),
            };
            for record in records {
                if let RData::SRV(srv) = &record.data {
                    let target = srv.target.to_string();
                    found.extend(Self::addresses(resolver, &target, srv.port).await?);
                }
            }
        } else {
            found = Self::addresses(resolver, &self.name, self.port.unwrap_or(80)).await?;
        }
        found.sort();
        found.dedup();
        Ok(found)
    }
}
