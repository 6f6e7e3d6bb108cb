//! A one-broker cluster on loopback for the crate's own tests: temporary data
//! and Rill-home directories that live as long as the broker.

use std::sync::Arc;

use rill_proto::wire::{CreateTopicsRequest, NewTopic};

use crate::state::BrokerState;
use crate::{Broker, BrokerConfig, BrokerHandle};

pub(crate) struct TestBroker {
    pub(crate) broker: BrokerHandle,
    _data: tempfile::TempDir,
    _home: tempfile::TempDir,
}

impl TestBroker {
    /// Starts a broker on 127.0.0.1:0 with `tweak` applied to its default config.
    pub(crate) async fn start(tweak: impl FnOnce(&mut BrokerConfig)) -> TestBroker {
        let data = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().to_path_buf(),
            rill_home: Some(home.path().to_path_buf()),
            ..BrokerConfig::default()
        };
        tweak(&mut config);
        let broker = Broker::start(config).await.unwrap();
        TestBroker {
            broker,
            _data: data,
            _home: home,
        }
    }

    pub(crate) fn state(&self) -> Arc<BrokerState> {
        self.broker.state.clone()
    }

    /// Creates topic `name` of `partitions` (replication factor and configs
    /// by default), asserting it was created.
    pub(crate) async fn create_topic(&self, name: &str, partitions: u32) {
        let created = crate::handlers::create_topics(
            &self.broker.state,
            CreateTopicsRequest {
                topics: vec![NewTopic {
                    name: name.into(),
                    partitions: Some(partitions),
                    replication_factor: None,
                    configs: Vec::new(),
                }],
                validate_only: false,
            },
        )
        .await
        .unwrap();
        assert!(created.results[0].error.is_none(), "{created:?}");
    }

    pub(crate) async fn shutdown(self) {
        self.broker.shutdown().await.unwrap();
    }
}
