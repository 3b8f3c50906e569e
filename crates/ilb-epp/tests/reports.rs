//! Traffic that enters through the gateway is planned globally: an EPP that routes with a
//! control plane's snapshots reports what it routed, as a data plane does. Here the EPP is
//! driven as Envoy drives it (ext_proc messages), in front of two simulated engines that a real
//! control plane scrapes and plans; the control plane's view must list the EPP among the
//! reporting data planes and measure the class's demand from its reports.

mod support;

use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlaneConfig, Router, SnapshotSource};
use std::time::Duration;
use support::{
    chat_body, chat_headers, request_body, request_headers, response_body, response_headers, DUPLEX,
};

const TOKEN: &str = "t0ken";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_epp_reports_what_it_routed_to_the_control_plane() {
    let mut engines = Vec::new();
    let mut toml = format!(
        "[control_plane]\nlisten = \"127.0.0.1:0\"\nscrape_interval_ms = 250\nsolve_interval_ms = 250\n\
         token = \"{TOKEN}\"\n[network]\nuse_measured = false\n[[clusters]]\nid = \"a\"\nregion = \"a\"\n\
         [profiles.gpu]\ncapacity_rps = 40.0\nttft_t0_ms = 30.0\nttft_b_ms = 10.0\n"
    );
    for i in 0..2 {
        let config = ilb_engine_sim::EngineConfig {
            id: ilb_core::EngineId::new(format!("e{i}")),
            model: ilb_core::ModelName::new("m"),
            ..Default::default()
        };
        let engine = ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        toml.push_str(&format!(
            "[[engines]]\nid = \"e{i}\"\nurl = \"{}\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n",
            engine.url()
        ));
        engines.push(engine);
    }
    let fleet: ilb_controlplane::FleetConfig = toml::from_str(&toml).unwrap();
    fleet.validate().unwrap();
    let cp = ilb_controlplane::ControlPlane::start(fleet, "127.0.0.1:0".parse().unwrap()).await.unwrap();

    let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    config.cluster = Some(ilb_core::ClusterId::new("a"));
    let source = SnapshotSource::Poll {
        url: format!("{}/v1/snapshots/a", cp.url()),
        interval: Duration::from_millis(100),
        long_poll: true,
    };
    let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), "epp-a".into());
    reports.interval = Duration::from_millis(250);
    reports.token = Some(TOKEN.into());
    let router = Router::start(config, source, Some(reports));
    let epp = ilb_epp::Epp::start("127.0.0.1:0".parse().unwrap(), router).await.unwrap();
    let mut client = envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient::connect(
        format!("http://{}", epp.local_addr()),
    )
    .await
    .unwrap();
    for _ in 0..500 {
        if epp.router().installed().is_some_and(|i| !i.engines.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(epp.router().installed().is_some_and(|i| !i.engines.is_empty()), "no plan installed in 10 s");

    // Requests as Envoy sends them, answered by the engine the EPP picked, for a few seconds
    // (40 requests, 100 ms apart: about 10 req/s).
    for n in 0..40 {
        let mut stream = support::Stream::open(&mut client).await;
        stream.send(request_headers(&chat_headers(Some(&format!("s{n}"))), false, DUPLEX)).await;
        stream.send(request_body(&chat_body("m", "hello"), true)).await;
        let answer = stream.recv().await.unwrap();
        let endpoints = support::metadata_endpoints(&answer).expect("a pick in envoy.lb");
        let served = endpoints.split(',').next().unwrap().to_owned();
        stream.send(response_headers("200", "application/json", Some(&served))).await;
        stream.send(response_body(b"{}", true)).await;
        drop(stream);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The control plane sees the EPP's reports: it lists it, and the class's demand is measured.
    let mut seen = None;
    for _ in 0..250 {
        let view = cp.view();
        let listed = view.data_planes.iter().any(|d| d.instance == "epp-a" && d.cluster == "a");
        let demand = view
            .models
            .iter()
            .filter(|m| m.model == "m")
            .flat_map(|m| &m.classes)
            .filter(|c| c.cluster == "a")
            .map(|c| c.measured_demand_rps)
            .sum::<f64>();
        seen = Some((listed, demand));
        if listed && demand > 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (listed, demand) = seen.unwrap();
    assert!(listed, "the control plane does not list the EPP among its data planes");
    assert!(demand > 1.0, "the control plane measured {demand} req/s of demand from the EPP's reports");
    epp.shutdown().await;
    cp.shutdown().await;
}
