//! What the control loop ([`crate::run`]) hears and what the tasks it starts get from it: the
//! closed [`Event`] enum every trigger of work arrives as, and [`ControlHandles`]. The API,
//! discovery and the scrapers send events; only the loop receives them. This module sits below
//! all of them, so none imports the loop.

use crate::scrape::HttpClient;
use ilb_core::report::Report;
use ilb_core::ModelName;
use ilb_planning::config::{Engine, FleetConfig};
use ilb_planning::fleet::members::{RegisterError, RegisterOutcome, Registration};
use ilb_planning::signals::EngineSample;
use ilb_planning::{Planner, Round};
use tokio::sync::{mpsc, oneshot, watch};

pub(crate) enum Event {
    /// A scrape of engine `engine` at `url` finished.
    Scraped {
        engine: String,
        url: String,
        result: Result<Vec<(ModelName, EngineSample)>, String>,
    },
    Report(Box<Report>),
    Tick,
    Solved(Box<Solved>),
    /// A new configuration file, or why the file that changed was refused.
    Reload(Box<Result<FleetConfig, String>>),
    /// `POST /v1/engines`.
    Register(Box<Registration>, oneshot::Sender<Result<RegisterOutcome, RegisterError>>),
    /// `DELETE /v1/engines/{id}`; answers whether it was registered.
    Deregister(String, oneshot::Sender<bool>),
    /// A discovery group's engines after a resolution.
    Discovered {
        group: String,
        engines: Vec<Engine>,
    },
    /// This replica became the planning leader (`election.rs`): plan now.
    Elected,
}

/// A solve that finished on its blocking thread, with the planner it took there.
pub(crate) struct Solved {
    pub(crate) round: Round,
    pub(crate) planner: Planner,
    /// The engine-set generation the plans were built from.
    pub(crate) generation: u64,
}

/// What tasks the loop starts need from it.
pub(crate) struct ControlHandles {
    pub(crate) client: HttpClient,
    pub(crate) events: mpsc::Sender<Event>,
    pub(crate) shutdown: watch::Receiver<bool>,
}
