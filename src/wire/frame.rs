//! Kafka's length-prefixed framing and the request/response headers, over byte buffers only.
//!
//! Every Kafka message on a connection is an int32 length followed by that many bytes: a header
//! (whose version follows from the API version, see kafka-formats.md §6.1) and the body. The
//! `kafka-protocol` crate encodes headers and bodies but does not frame them; this module does,
//! and it is the one place where a length from the wire is checked against
//! `limits::FRAME_BYTES_MAX` before anything is buffered for it.
//!
//! Responses are decoded from `bytes::Bytes`, never from `&[u8]`: the crate then hands out
//! `records` as slices of the frame (zero copy) instead of copies.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::limits::FRAME_BYTES_MAX;

/// Bytes of the int32 length in front of every frame.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Why a frame could not be produced or understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} is negative")]
    NegativeLength { len: i32 },
    #[error("frame length {len} exceeds the limit {max}")]
    TooLarge { len: usize, max: usize },
    #[error("encoding api {api} v{version}: {reason}")]
    Encode {
        api: i16,
        version: i16,
        reason: String,
    },
    #[error("decoding the response header of api {api} v{version}: {reason}")]
    Header {
        api: i16,
        version: i16,
        reason: String,
    },
    #[error("decoding the body of api {api} v{version}: {reason}")]
    Body {
        api: i16,
        version: i16,
        reason: String,
    },
    #[error("response carries correlation id {got}, expected {expected}")]
    CorrelationMismatch { expected: i32, got: i32 },
    #[error("api {api} v{version} response has {left} bytes left over after its body")]
    LeftoverBytes { api: i16, version: i16, left: usize },
}

/// The size of the frame body announced at the front of `buf`, once the 4-byte prefix is there.
/// A negative or oversized length is an error: the stream can no longer be trusted.
pub fn body_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes(prefix.try_into().expect("4 bytes"));
    if len < 0 {
        return Err(FrameError::NegativeLength { len });
    }
    let len = len as usize;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        });
    }
    Ok(Some(len))
}

/// Take one whole frame body off the front of a stream buffer, or `None` while it is incomplete.
/// The returned `Bytes` shares the buffer's memory.
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
    let Some(len) = body_len(buf)? else {
        return Ok(None);
    };
    if buf.len() < LENGTH_PREFIX_BYTES + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(LENGTH_PREFIX_BYTES + len);
    frame.advance(LENGTH_PREFIX_BYTES);
    Ok(Some(frame.freeze()))
}

/// Append one framed request (length, header, body) to `out`. On error `out` is left as it was.
pub fn encode_request<R: Request>(
    out: &mut BytesMut,
    version: i16,
    correlation_id: i32,
    client_id: &StrBytes,
    body: &R,
) -> Result<(), FrameError> {
    let start = out.len();
    let result = encode_request_inner(out, version, correlation_id, client_id, body);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_request_inner<R: Request>(
    out: &mut BytesMut,
    version: i16,
    correlation_id: i32,
    client_id: &StrBytes,
    body: &R,
) -> Result<(), FrameError> {
    let encode_err = |e: anyhow::Error| FrameError::Encode {
        api: R::KEY,
        version,
        reason: format!("{e:#}"),
    };
    let start = out.len();
    out.put_i32(0);
    let mut header = RequestHeader::default();
    header.request_api_key = R::KEY;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = Some(client_id.clone());
    header
        .encode(out, R::header_version(version))
        .map_err(encode_err)?;
    body.encode(out, version).map_err(encode_err)?;
    let len = out.len() - start - LENGTH_PREFIX_BYTES;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        });
    }
    out[start..start + LENGTH_PREFIX_BYTES].copy_from_slice(&(len as i32).to_be_bytes());
    Ok(())
}

/// The correlation id at the front of a response frame body. It is the first field of both
/// response header versions, so it can be read before the API of the response is known.
pub fn peek_correlation_id(frame: &[u8]) -> Option<i32> {
    Some(i32::from_be_bytes(
        frame.get(..4)?.try_into().expect("4 bytes"),
    ))
}

/// Strip and check the response header of `frame` (a body from `split_frame`), leaving the
/// response body in `frame`.
///
/// The header version follows the response's API version, with one exception the crate already
/// encodes: ApiVersions responses always use header v0, even for flexible versions, so that a
/// client can read the error of a version the broker does not know.
pub fn strip_response_header<R: Request>(
    frame: &mut Bytes,
    version: i16,
    expected_correlation_id: i32,
) -> Result<(), FrameError> {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    let header = ResponseHeader::decode(frame, header_version).map_err(|e| FrameError::Header {
        api: R::KEY,
        version,
        reason: format!("{e:#}"),
    })?;
    if header.correlation_id != expected_correlation_id {
        return Err(FrameError::CorrelationMismatch {
            expected: expected_correlation_id,
            got: header.correlation_id,
        });
    }
    Ok(())
}

/// Whether `prefix`, the first bytes of a response frame's body, holds the whole response
/// header (so `strip_response_header` can judge it).
pub fn response_header_whole<R: Request>(prefix: &Bytes, version: i16) -> bool {
    let header_version = <R::Response as HeaderVersion>::header_version(version);
    ResponseHeader::decode(&mut prefix.clone(), header_version).is_ok()
}

/// Decode a response body (what `strip_response_header` left). A body that does not use up
/// every byte is an error: it means we and the broker disagree on the layout.
pub fn decode_response_body<R: Request>(
    mut body: Bytes,
    version: i16,
) -> Result<R::Response, FrameError> {
    let response = R::Response::decode(&mut body, version).map_err(|e| FrameError::Body {
        api: R::KEY,
        version,
        reason: format!("{e:#}"),
    })?;
    if body.has_remaining() {
        return Err(FrameError::LeftoverBytes {
            api: R::KEY,
            version,
            left: body.remaining(),
        });
    }
    Ok(response)
}

/// Header check and body decode in one step.
pub fn decode_response<R: Request>(
    mut frame: Bytes,
    version: i16,
    expected_correlation_id: i32,
) -> Result<R::Response, FrameError> {
    strip_response_header::<R>(&mut frame, version, expected_correlation_id)?;
    decode_response_body::<R>(frame, version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{
        ApiKey, ApiVersionsRequest, ApiVersionsResponse, FetchRequest, FetchResponse,
    };

    // Goal: a framed request carries the length of what follows and a header in the version
    // Kafka expects (v2 for flexible APIs, v1 otherwise). Method: encode, then decode the header
    // with the crate's broker-side decoder, which picks the header version from the API version.
    #[test]
    fn request_frame_has_length_and_right_header_version() {
        for (version, header_len_flexible) in [(11_i16, false), (12, true)] {
            let mut out = BytesMut::new();
            let client = StrBytes::from_static_str("kmirror");
            encode_request(&mut out, version, 7, &client, &FetchRequest::default()).unwrap();
            let len = body_len(&out).unwrap().unwrap();
            assert_eq!(len + LENGTH_PREFIX_BYTES, out.len());
            let mut frame = split_frame(&mut out).unwrap().unwrap();
            assert!(out.is_empty());
            let header =
                kafka_protocol::protocol::decode_request_header_from_buffer(&mut frame).unwrap();
            assert_eq!(header.request_api_key, ApiKey::Fetch as i16);
            assert_eq!(header.request_api_version, version);
            assert_eq!(header.correlation_id, 7);
            assert_eq!(header.client_id.as_deref(), Some("kmirror"));
            let body = FetchRequest::decode(&mut frame, version).unwrap();
            assert_eq!(body, FetchRequest::default());
            assert_eq!(frame.len(), 0, "flexible={header_len_flexible}");
        }
    }

    #[test]
    fn split_frame_waits_for_whole_frame() {
        let mut buf = BytesMut::from(&[0u8, 0, 0][..]);
        assert_eq!(split_frame(&mut buf).unwrap(), None);
        buf.put_u8(3);
        buf.put_slice(&[1, 2]);
        assert_eq!(split_frame(&mut buf).unwrap(), None);
        buf.put_slice(&[3, 9]);
        assert_eq!(split_frame(&mut buf).unwrap().unwrap().as_ref(), &[1, 2, 3]);
        assert_eq!(buf.as_ref(), &[9]);
    }

    #[test]
    fn oversized_and_negative_lengths_are_errors() {
        let too_big = ((FRAME_BYTES_MAX + 1) as i32).to_be_bytes();
        assert!(matches!(
            body_len(&too_big),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            body_len(&(-1_i32).to_be_bytes()),
            Err(FrameError::NegativeLength { len: -1 })
        ));
    }

    fn response_frame<R: Encodable + HeaderVersion>(resp: &R, version: i16, corr: i32) -> Bytes {
        let mut out = BytesMut::new();
        let header = ResponseHeader::default().with_correlation_id(corr);
        header.encode(&mut out, R::header_version(version)).unwrap();
        resp.encode(&mut out, version).unwrap();
        out.freeze()
    }

    // Goal: ApiVersions responses are read with header v0 even at flexible v3, while Fetch v12
    // uses header v1 (a tagged-field byte after the correlation id).
    #[test]
    fn api_versions_response_header_is_always_v0() {
        let resp = ApiVersionsResponse::default();
        let frame = response_frame(&resp, 3, 5);
        let decoded = decode_response::<ApiVersionsRequest>(frame, 3, 5).unwrap();
        assert_eq!(decoded, resp);
        // A v1 header is one byte longer than a v0 header.
        let fetch = FetchResponse::default();
        let v11 = response_frame(&fetch, 11, 1);
        let v12 = response_frame(&fetch, 12, 1);
        assert!(decode_response::<FetchRequest>(v12, 12, 1).is_ok());
        assert!(decode_response::<FetchRequest>(v11, 11, 1).is_ok());
    }

    #[test]
    fn wrong_correlation_and_leftover_bytes_are_errors() {
        let frame = response_frame(&FetchResponse::default(), 12, 4);
        assert_eq!(
            decode_response::<FetchRequest>(frame.clone(), 12, 5),
            Err(FrameError::CorrelationMismatch {
                expected: 5,
                got: 4
            })
        );
        let mut longer = BytesMut::from(frame.as_ref());
        longer.put_u8(0);
        assert!(matches!(
            decode_response::<FetchRequest>(longer.freeze(), 12, 4),
            Err(FrameError::LeftoverBytes { left: 1, .. })
        ));
        let short = frame.slice(..frame.len() - 1);
        assert!(matches!(
            decode_response::<FetchRequest>(short, 12, 4),
            Err(FrameError::Body { .. })
        ));
    }

    #[test]
    fn failed_encode_leaves_buffer_untouched() {
        let mut out = BytesMut::from(&b"keep"[..]);
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        let mut req = FetchRequest::default();
        // last_fetched_epoch is not representable before v12: the crate refuses to drop it.
        let mut partition = FetchPartition::default();
        partition.last_fetched_epoch = 3;
        req.topics = vec![FetchTopic::default().with_partitions(vec![partition])];
        let err = encode_request(&mut out, 4, 1, &StrBytes::from_static_str("k"), &req);
        assert!(matches!(err, Err(FrameError::Encode { .. })));
        assert_eq!(out.as_ref(), b"keep");
    }
}
