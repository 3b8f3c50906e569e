//! Discovery by DNS against a real DNS server on loopback (hickory-server, in-process, serving
//! a zone the test changes while traffic runs): engines on 127.0.0.2-7, one port, found by A
//! records; the fleet grows from 2 to 6 and back with no failed request, addresses that go
//! are removed after two resolutions. SRV records, "no such name" and a dead server are
//! checked on the source directly.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod fleet_support;
mod support;
mod wait;

use fleet_support::*;
use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType, RrKey};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use hickory_server::Server;
use ilb_controlplane::discovery::dns::DnsSource;
use ilb_controlplane::discovery::Resolve;
use ilb_engine_sim::EngineHandle;
use ilb_planning::config::EngineGroup;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const RESOLVE_MS: u64 = 250;

/// An authoritative server for `test.` on 127.0.0.1 (UDP and TCP on one port).
struct Dns {
    addr: SocketAddr,
    zone: Arc<InMemoryZoneHandler>,
    serial: u32,
    _server: Server<Catalog>,
}

impl Dns {
    async fn start() -> Dns {
        let origin = Name::from_str("test.").unwrap();
        let zone = InMemoryZoneHandler::empty(origin.clone(), ZoneType::Primary, AxfrPolicy::Deny);
        let soa = SOA::new(
            Name::from_str("ns.test.").unwrap(),
            Name::from_str("admin.test.").unwrap(),
            1,
            60,
            60,
            60,
            0,
        );
        assert!(zone.upsert(Record::from_rdata(origin.clone(), 0, RData::SOA(soa)), 1).await);
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::from(origin), vec![zone.clone()]);
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        let mut server = Server::new(catalog);
        server.register_socket(udp);
        if let Ok(tcp) = tokio::net::TcpListener::bind(addr).await {
            server.register_listener(tcp, Duration::from_secs(5), 4096);
        }
        Dns { addr, zone, serial: 1, _server: server }
    }

    /// Replaces the records of `name` of `kind` with `rdata`.
    async fn set(&mut self, name: &str, kind: RecordType, rdata: Vec<RData>) {
        let name = Name::from_str(name).unwrap();
        self.serial += 1;
        self.zone.records_mut().await.remove(&RrKey::new(LowerName::from(name.clone()), kind));
        for data in rdata {
            assert!(self.zone.upsert(Record::from_rdata(name.clone(), 0, data), self.serial).await);
        }
    }

    async fn set_a(&mut self, name: &str, ips: &[Ipv4Addr]) {
        self.set(name, RecordType::A, ips.iter().map(|ip| RData::A(A(*ip))).collect()).await;
    }
}

/// Six engines on 127.0.0.2 … 127.0.0.7, all on one port (A records carry no port).
async fn engines_on_one_port() -> (Vec<EngineHandle>, u16) {
    for _ in 0..10 {
        let probe = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let mut engines = Vec::new();
        for i in 0..6u8 {
            let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 0, 2 + i), port));
            let config = ilb_engine_sim::EngineConfig {
                id: ilb_core::EngineId::new(format!("sim-{i}")),
                model: ilb_core::ModelName::new("m"),
                profile: profile(),
                latency: true,
                seed: u64::from(i),
                ..ilb_engine_sim::EngineConfig::default()
            };
            match ilb_engine_sim::spawn(config, addr).await {
                Ok(e) => engines.push(e),
                Err(_) => break,
            }
        }
        if engines.len() == 6 {
            return (engines, port);
        }
    }
    panic!("no port free on 127.0.0.2-7");
}

fn ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + i)
}

fn group_ids(port: u16, range: std::ops::Range<u8>) -> Vec<String> {
    range.map(|i| format!("pool-127-0-0-{}-{port}", 2 + i)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_discovery_grows_the_fleet_from_two_to_six_and_back_under_load() {
    let (_engines, port) = engines_on_one_port().await;
    let mut dns = Dns::start().await;
    dns.set_a("engines.test.", &[ip(0), ip(1)]).await;
    let group = format!(
        r#"
[[engine_groups]]
id = "pool"
dns = "engines.test."
port = {port}
resolve_interval_ms = {RESOLVE_MS}
nameservers = ["{}"]
model = "m"
region = "a"
profile = "gpu"
"#,
        dns.addr
    );
    let mut stack = Stack::start(parse(&fleet_toml(&[], &group)), 8).await;
    stack.run_for(Duration::from_secs(1)).await;
    let members = stack.cp.view().membership.engines.clone();
    assert!(
        members.iter().all(|m| m.source == "discovered" && m.group.as_deref() == Some("pool")),
        "{members:?}"
    );

    let at = Instant::now();
    dns.set_a("engines.test.", &(0..6).map(ip).collect::<Vec<_>>()).await;
    stack.reflected("DNS: 2 → 6 A records", at, &group_ids(port, 2..6), &[]).await;
    stack.run_for(Duration::from_secs(2)).await;

    // One listing without an address does not remove it; two do.
    let at = Instant::now();
    dns.set_a("engines.test.", &[ip(0), ip(1)]).await;
    let reflected = stack
        .reflected("DNS: 6 → 2 A records (gone for two resolutions)", at, &[], &group_ids(port, 2..6))
        .await;
    assert!(
        reflected - at >= Duration::from_millis(RESOLVE_MS),
        "an address was removed after a single resolution missed it"
    );

    let (recs, _) = stack.finish().await;
    assert_no_failures(&recs);
}

fn group(dns: &Dns, name: &str, srv: bool) -> EngineGroup {
    let text = format!(
        "id = \"g\"\ndns = \"{name}\"\nsrv = {srv}\nport = 1\nnameservers = [\"{}\"]\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n",
        dns.addr
    );
    toml::from_str(&text).unwrap()
}

#[tokio::test]
async fn the_dns_source_reads_srv_records_and_tells_no_records_from_no_answer() {
    let mut dns = Dns::start().await;
    dns.set_a("a.test.", &[Ipv4Addr::new(127, 0, 0, 2)]).await;
    dns.set_a("b.test.", &[Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)]).await;
    let srv = |port, target: &str| RData::SRV(SRV::new(0, 0, port, Name::from_str(target).unwrap()));
    dns.set("_http._tcp.pool.test.", RecordType::SRV, vec![srv(8001, "a.test."), srv(8002, "b.test.")]).await;

    let mut source = DnsSource::new(&group(&dns, "_http._tcp.pool.test.", true));
    let found = source.resolve().await.unwrap();
    let expected: Vec<SocketAddr> =
        ["127.0.0.2:8001", "127.0.0.3:8002", "127.0.0.4:8002"].iter().map(|a| a.parse().unwrap()).collect();
    assert_eq!(found, expected);
    // Records change: the next resolution sees them (nothing is cached).
    dns.set("_http._tcp.pool.test.", RecordType::SRV, vec![srv(8001, "a.test.")]).await;
    assert_eq!(source.resolve().await.unwrap(), expected[..1]);

    // A name without records is an answer: no engines.
    let mut missing = DnsSource::new(&group(&dns, "nothing.test.", false));
    assert_eq!(missing.resolve().await.unwrap(), Vec::<SocketAddr>::new());

    // A server that does not answer is a failure, not an empty group.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut dead = group(&dns, "a.test.", false);
    dead.nameservers = vec![silent.local_addr().unwrap().to_string()];
    assert!(DnsSource::new(&dead).resolve().await.is_err());
}
