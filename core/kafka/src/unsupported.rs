//! Answers to the Kafka apis this listener does not serve, so a client that
//! sends one anyway (one that skipped ApiVersions, or a tool that does not
//! check it) gets Kafka's UNSUPPORTED_VERSION in the response it waits for,
//! with a message where the response has room for one, instead of a dropped
//! connection. Requests whose response carries an error per item (topics,
//! ACLs) are decoded to answer each item.
//!
//! What cannot be answered (a response with no error field at the version
//! asked, or one this crate cannot encode) still closes the connection, with
//! the log line naming api and version.

use crate::codes::kafka::UNSUPPORTED_VERSION;
use crate::{Closed, encode_response};
use bytes::Bytes;
use kafka_protocol::messages as km;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, StrBytes};

fn why(key: ApiKey) -> String {
    format!(
        "{key:?} is not supported by this broker's Kafka listener (see ApiVersions for what it serves)"
    )
}

/// The response frame answering `key` at `version` with UNSUPPORTED_VERSION,
/// or why it cannot be answered.
pub(crate) fn answer(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    mut body: Bytes,
) -> Result<Bytes, Closed> {
    let message = Some(StrBytes::from_string(why(key)));
    macro_rules! reply {
        ($response:expr) => {
            encode_response(key, version, correlation_id, &$response)
        };
    }
    macro_rules! top {
        ($response:ty) => {
            reply!(<$response>::default().with_error_code(UNSUPPORTED_VERSION))
        };
    }
    macro_rules! top_with_message {
        ($response:ty) => {{
            let with = <$response>::default()
                .with_error_code(UNSUPPORTED_VERSION)
                .with_error_message(message.clone());
            // Versions without the message field take the code alone.
            reply!(with).or_else(|_| top!($response))
        }};
    }
    fn decode<R: Decodable>(key: ApiKey, version: i16, body: &mut Bytes) -> Result<R, Closed> {
        R::decode(body, version)
            .map_err(|e| Closed::Because(format!("malformed {key:?} v{version} request: {e}")))
    }
    match key {
        ApiKey::AddOffsetsToTxn => top!(km::AddOffsetsToTxnResponse),
        ApiKey::AddPartitionsToTxn => top!(km::AddPartitionsToTxnResponse),
        ApiKey::EndTxn => top!(km::EndTxnResponse),
        ApiKey::ListTransactions => top!(km::ListTransactionsResponse),
        ApiKey::DescribeAcls => top_with_message!(km::DescribeAclsResponse),
        ApiKey::DescribeClientQuotas => top_with_message!(km::DescribeClientQuotasResponse),
        ApiKey::DescribeLogDirs => top!(km::DescribeLogDirsResponse),
        ApiKey::DescribeUserScramCredentials => {
            top_with_message!(km::DescribeUserScramCredentialsResponse)
        }
        ApiKey::ElectLeaders => top!(km::ElectLeadersResponse),
        ApiKey::AlterPartitionReassignments => {
            top_with_message!(km::AlterPartitionReassignmentsResponse)
        }
        ApiKey::ListPartitionReassignments => {
            top_with_message!(km::ListPartitionReassignmentsResponse)
        }
        ApiKey::OffsetDelete => top!(km::OffsetDeleteResponse),
        ApiKey::CreateDelegationToken => top!(km::CreateDelegationTokenResponse),
        ApiKey::RenewDelegationToken => top!(km::RenewDelegationTokenResponse),
        ApiKey::ExpireDelegationToken => top!(km::ExpireDelegationTokenResponse),
        ApiKey::DescribeDelegationToken => top!(km::DescribeDelegationTokenResponse),
        ApiKey::GetTelemetrySubscriptions => top!(km::GetTelemetrySubscriptionsResponse),
        ApiKey::PushTelemetry => top!(km::PushTelemetryResponse),
        ApiKey::UpdateFeatures => top_with_message!(km::UpdateFeaturesResponse),
        ApiKey::DeleteRecords => {
            let r: km::DeleteRecordsRequest = decode(key, version, &mut body)?;
            let topics = r
                .topics
                .iter()
                .map(|t| {
                    km::delete_records_response::DeleteRecordsTopicResult::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    km::delete_records_response::DeleteRecordsPartitionResult::default()
                                        .with_partition_index(p.partition_index)
                                        .with_low_watermark(-1)
                                        .with_error_code(UNSUPPORTED_VERSION)
                                })
                                .collect(),
                        )
                })
                .collect();
            reply!(km::DeleteRecordsResponse::default().with_topics(topics))
        }
        ApiKey::CreateAcls => {
            let r: km::CreateAclsRequest = decode(key, version, &mut body)?;
            let results = r
                .creations
                .iter()
                .map(|_| {
                    km::create_acls_response::AclCreationResult::default()
                        .with_error_code(UNSUPPORTED_VERSION)
                        .with_error_message(message.clone())
                })
                .collect();
            reply!(km::CreateAclsResponse::default().with_results(results))
        }
        ApiKey::DeleteAcls => {
            let r: km::DeleteAclsRequest = decode(key, version, &mut body)?;
            let results = r
                .filters
                .iter()
                .map(|_| {
                    km::delete_acls_response::DeleteAclsFilterResult::default()
                        .with_error_code(UNSUPPORTED_VERSION)
                        .with_error_message(message.clone())
                })
                .collect();
            reply!(km::DeleteAclsResponse::default().with_filter_results(results))
        }
        other => Err(Closed::Because(format!(
            "{other:?} v{version} is not served by this broker's Kafka listener and has no error \
             answer here; clients learn what is served from ApiVersions"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Encodable;

    /// Every answer this module gives encodes at every version of its api.
    #[test]
    fn every_answer_encodes_at_every_version() {
        let answered = [
            ApiKey::AddOffsetsToTxn,
            ApiKey::EndTxn,
            ApiKey::ListTransactions,
            ApiKey::DescribeAcls,
            ApiKey::DescribeClientQuotas,
            ApiKey::DescribeUserScramCredentials,
            ApiKey::AlterPartitionReassignments,
            ApiKey::ListPartitionReassignments,
            ApiKey::OffsetDelete,
            ApiKey::UpdateFeatures,
            ApiKey::DeleteRecords,
            ApiKey::CreateAcls,
            ApiKey::DeleteAcls,
        ];
        for key in answered {
            let range = key.valid_versions();
            for version in range.min..=range.max {
                // An empty request of the api, as a client would send it.
                let body = empty_request(key, version);
                let frame = answer(key, version, 7, body)
                    .unwrap_or_else(|e| panic!("{key:?} v{version}: {e:?}"));
                assert!(frame.len() > 8, "{key:?} v{version}");
            }
        }
    }

    fn empty_request(key: ApiKey, version: i16) -> Bytes {
        let mut out = bytes::BytesMut::new();
        let r = match key {
            ApiKey::DeleteRecords => km::DeleteRecordsRequest::default().encode(&mut out, version),
            ApiKey::CreateAcls => km::CreateAclsRequest::default().encode(&mut out, version),
            ApiKey::DeleteAcls => km::DeleteAclsRequest::default().encode(&mut out, version),
            _ => Ok(()),
        };
        r.unwrap();
        out.freeze()
    }
}
