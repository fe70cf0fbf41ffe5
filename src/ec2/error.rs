//! One typed error for every EC2 backend (SDK, simulator), classified from AWS error codes so
//! callers act on the kind and never parse messages themselves.

use std::fmt;

use super::model::Operation;

/// What went wrong, in the terms the operator acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `RequestLimitExceeded` / `Throttling`: retry later, slow the bucket down.
    Throttled,
    /// `InsufficientFreeAddressesInSubnet`: the subnet has no free address.
    SubnetExhausted,
    /// No aligned free /28 in the subnet (`InsufficientCidrBlocks`, or `InvalidParameterValue`
    /// "There aren't sufficient free Ipv4 addresses or prefixes"): fall back to single IPs.
    InsufficientCidrBlocks,
    /// `AttachmentLimitExceeded`: the instance has no free ENI slot.
    AttachmentLimitExceeded,
    /// `PrivateIpAddressLimitExceeded`: the ENI has no free address slot.
    IpLimitExceeded,
    /// The device index is taken (`InvalidParameterValue` "interface attached at device").
    DeviceIndexInUse,
    /// The instance is not in state `running` ("is not 'running'").
    InstanceNotRunning,
    /// A referenced resource does not exist.
    NotFound(Resource),
    /// `IdempotentParameterMismatch`: a client token reused with other parameters.
    IdempotencyMismatch,
    /// `UnauthorizedOperation`, `AuthFailure`, ...: permissions or credentials.
    Unauthorized,
    /// 5xx, timeouts, connection failures: retry.
    Transient,
    /// Another client error (`InvalidParameterValue`, `InvalidParameterCombination`, ...).
    Other,
}

/// The kind of resource a not-found error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    Instance,
    InstanceType,
    NetworkInterface,
    Attachment,
    Subnet,
    SecurityGroup,
    Vpc,
    Other,
}

/// An EC2 failure: its kind, plus AWS's own code and message kept for the operator's status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Ec2Error {
    pub operation: Operation,
    pub kind: ErrorKind,
    /// AWS error code (`InsufficientFreeAddressesInSubnet`, ...), or a local label such as
    /// `Timeout` / `Dispatch` for failures that never reached AWS.
    pub code: String,
    pub message: String,
}

impl fmt::Display for Ec2Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.operation, self.code)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl Ec2Error {
    pub fn new(
        operation: Operation,
        kind: ErrorKind,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            operation,
            kind,
            code: code.into(),
            message: stable_message(&message.into()),
        }
    }

    /// Classify an answer from AWS (or an emulator) by its error code, message and HTTP status.
    pub fn from_aws(
        operation: Operation,
        code: &str,
        message: &str,
        http_status: Option<u16>,
    ) -> Self {
        Self::new(
            operation,
            classify(code, message, http_status),
            code,
            message,
        )
    }

    /// A failure that never got an answer (timeout, connection, dispatch).
    pub fn transient(operation: Operation, code: &str, message: impl Into<String>) -> Self {
        Self::new(operation, ErrorKind::Transient, code, message)
    }

    /// Worth retrying with backoff: throttling and transient failures only.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Throttled | ErrorKind::Transient)
    }

    pub fn is_throttled(&self) -> bool {
        self.kind == ErrorKind::Throttled
    }

    /// `AssociateAddress` met an address that is associated already (another node won it).
    pub fn is_already_associated(&self) -> bool {
        self.code == "Resource.AlreadyAssociated"
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound(_))
    }
}

/// At most this many bytes of an error's message go on a node's `operator-status` (and into
/// its Events): the first line of AWS's message is rarely longer; what follows it (a raw HTTP
/// answer, an encoded authorization message) differs from one failure to the next.
pub const MAX_MESSAGE: usize = 240;

/// Where an AWS message turns into per-request detail: the rest is cut (case-insensitive).
const PER_REQUEST: [&str; 6] = [
    "encoded authorization failure message",
    "request id",
    "requestid",
    "request-id",
    "(service:",
    "raw: response",
];

/// The same failure, the same text: the first line of `raw`, without what differs per request
/// (request IDs, UUIDs, encoded authorization messages, raw HTTP answers), at most
/// [`MAX_MESSAGE`] bytes. A failure repeated on every pass then writes nothing new to the
/// node's status and sends no new Event.
pub fn stable_message(raw: &str) -> String {
    let line = raw
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let lower = line.to_ascii_lowercase();
    let cut = PER_REQUEST
        .iter()
        .filter_map(|m| lower.find(m))
        .min()
        .unwrap_or(line.len());
    let words: Vec<&str> = line[..cut]
        .split_whitespace()
        .filter(|w| !is_uuid(w.trim_matches(|c: char| !c.is_ascii_alphanumeric())))
        .collect();
    let mut out = words.join(" ");
    let kept = out
        .trim_end_matches(|c: char| c.is_whitespace() || matches!(c, ':' | ',' | '(' | ';' | '-'))
        .len();
    out.truncate(kept);
    if out.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - '…'.len_utf8();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push('…');
    }
    out
}

/// A UUID (AWS's request IDs look like this).
fn is_uuid(w: &str) -> bool {
    w.len() == 36
        && w.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// AWS error code -> kind. Codes: <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html>.
pub fn classify(code: &str, message: &str, http_status: Option<u16>) -> ErrorKind {
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "TooManyRequests" => {
            ErrorKind::Throttled
        }
        "InsufficientFreeAddressesInSubnet" => ErrorKind::SubnetExhausted,
        "InsufficientCidrBlocks" => ErrorKind::InsufficientCidrBlocks,
        "AttachmentLimitExceeded" => ErrorKind::AttachmentLimitExceeded,
        "PrivateIpAddressLimitExceeded" => ErrorKind::IpLimitExceeded,
        "IdempotentParameterMismatch" => ErrorKind::IdempotencyMismatch,
        "UnauthorizedOperation"
        | "AuthFailure"
        | "Blocked"
        | "OptInRequired"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch" => ErrorKind::Unauthorized,
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" => {
            ErrorKind::NotFound(Resource::Instance)
        }
        "InvalidInstanceType" => ErrorKind::NotFound(Resource::InstanceType),
        "InvalidNetworkInterfaceID.NotFound" | "InvalidNetworkInterfaceID.Malformed" => {
            ErrorKind::NotFound(Resource::NetworkInterface)
        }
        "InvalidAttachmentID.NotFound" => ErrorKind::NotFound(Resource::Attachment),
        "InvalidSubnetID.NotFound" | "InvalidSubnetID.Malformed" => {
            ErrorKind::NotFound(Resource::Subnet)
        }
        "InvalidGroup.NotFound" | "InvalidSecurityGroupID.NotFound" => {
            ErrorKind::NotFound(Resource::SecurityGroup)
        }
        "InvalidVpcID.NotFound" => ErrorKind::NotFound(Resource::Vpc),
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            ErrorKind::Transient
        }
        "InvalidParameterValue" | "InvalidParameter"
            if message.contains("There aren't sufficient free Ipv4 addresses or prefixes") =>
        {
            ErrorKind::InsufficientCidrBlocks
        }
        _ if message.contains("interface attached at device") => ErrorKind::DeviceIndexInUse,
        _ if message.contains("is not 'running'") => ErrorKind::InstanceNotRunning,
        _ if code.ends_with(".NotFound") => ErrorKind::NotFound(Resource::Other),
        _ => match http_status {
            Some(s) if s >= 500 => ErrorKind::Transient,
            Some(429) => ErrorKind::Throttled,
            _ => ErrorKind::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_stable_and_bounded() {
        let op = Operation::AssignPrivateIpAddresses;
        let denied = |blob: &str| {
            Ec2Error::from_aws(
                op,
                "UnauthorizedOperation",
                &format!(
                    "You are not authorized to perform this operation. Encoded authorization \
                     failure message: {blob}"
                ),
                Some(403),
            )
        };
        let (a, b) = (denied("Xk2v...aaa"), denied("Q9zz...bbb"));
        assert_eq!(a, b, "the same failure twice, the same error");
        assert_eq!(
            a.message,
            "You are not authorized to perform this operation."
        );
        let with_id = |id: &str| {
            Ec2Error::transient(
                op,
                "InternalError",
                format!("An internal error has occurred (request id {id})\nraw: <html>"),
            )
        };
        let x = with_id("5b8f1c2e-0d9a-4f1b-9a54-1e2d3c4b5a69");
        assert_eq!(x, with_id("0a6c7d3e-1111-4bbb-8ccc-999988887777"));
        assert_eq!(x.message, "An internal error has occurred");
        let uuid = Ec2Error::transient(
            op,
            "Dispatch",
            "failed 5b8f1c2e-0d9a-4f1b-9a54-1e2d3c4b5a69 x",
        );
        assert_eq!(uuid.message, "failed x");
        let long = Ec2Error::transient(op, "Dispatch", "é".repeat(1000));
        assert!(long.message.len() <= MAX_MESSAGE, "{}", long.message.len());
        assert!(long.message.ends_with('…'));
        assert!(long.to_string().len() < MAX_MESSAGE + 80);
        // Classification still reads the whole message.
        let e = Ec2Error::from_aws(
            op,
            "InvalidParameterValue",
            "There aren't sufficient free Ipv4 addresses or prefixes",
            Some(400),
        );
        assert_eq!(e.kind, ErrorKind::InsufficientCidrBlocks);
    }

    #[test]
    fn classifies_the_codes_the_operator_acts_on() {
        let cases = [
            ("RequestLimitExceeded", "", None, ErrorKind::Throttled),
            (
                "InsufficientFreeAddressesInSubnet",
                "",
                Some(400),
                ErrorKind::SubnetExhausted,
            ),
            (
                "InsufficientCidrBlocks",
                "",
                Some(400),
                ErrorKind::InsufficientCidrBlocks,
            ),
            (
                "InvalidParameterValue",
                "There aren't sufficient free Ipv4 addresses or prefixes in the subnet",
                Some(400),
                ErrorKind::InsufficientCidrBlocks,
            ),
            (
                "InvalidParameterValue",
                "Instance 'i-1' already has an interface attached at device index '1'.",
                Some(400),
                ErrorKind::DeviceIndexInUse,
            ),
            (
                "IncorrectInstanceState",
                "The instance 'i-1' is not 'running'.",
                Some(400),
                ErrorKind::InstanceNotRunning,
            ),
            (
                "AttachmentLimitExceeded",
                "",
                Some(400),
                ErrorKind::AttachmentLimitExceeded,
            ),
            (
                "PrivateIpAddressLimitExceeded",
                "",
                Some(400),
                ErrorKind::IpLimitExceeded,
            ),
            (
                "InvalidNetworkInterfaceID.NotFound",
                "",
                Some(400),
                ErrorKind::NotFound(Resource::NetworkInterface),
            ),
            (
                "UnauthorizedOperation",
                "",
                Some(403),
                ErrorKind::Unauthorized,
            ),
            ("InternalError", "", Some(500), ErrorKind::Transient),
            ("Whatever", "", Some(503), ErrorKind::Transient),
            (
                "InvalidParameterCombination",
                "",
                Some(400),
                ErrorKind::Other,
            ),
        ];
        for (code, msg, status, kind) in cases {
            assert_eq!(classify(code, msg, status), kind, "{code}: {msg}");
        }
    }

    #[test]
    fn only_throttling_and_transient_failures_are_retryable() {
        let op = Operation::AssignPrivateIpAddresses;
        assert!(Ec2Error::from_aws(op, "RequestLimitExceeded", "", Some(503)).is_retryable());
        assert!(Ec2Error::transient(op, "Timeout", "no answer").is_retryable());
        assert!(
            !Ec2Error::from_aws(op, "PrivateIpAddressLimitExceeded", "", Some(400)).is_retryable()
        );
        assert!(!Ec2Error::from_aws(op, "UnauthorizedOperation", "", Some(403)).is_retryable());
    }
}
