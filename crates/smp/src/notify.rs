//! Handler notifications (type 0x1C, extension `spin-notify`): what a
//! streaming handler passed to `ops->notify` (include/corefarm/spin.h),
//! sent by the node to the server and relayed to the user that owns the
//! data message, always before that message's result or error.
//!
//! Notifications travel on the results' path, so data messages pay nothing
//! for them: the node queues a message's notifications on its sending task
//! just before the answer, in the message's class (so the outbox keeps them
//! ahead of it); the server maps the id back where it maps a result's and
//! relays them to a user that agreed `spin-notify`; the client keeps them in
//! a bounded queue of their own, so results never wait for them.
//!
//! Payload: `u32` id of the data message (as on the link it travels),
//! `u8` index of the handler set that sent it, then the notification's
//! bytes (at most [`MAX_NOTIFICATION`]).

use bytes::Bytes;

use crate::error::ProtocolError;
use crate::header::MsgType;
use crate::outframe::OutFrame;

/// Longest notification a handler may send (`ops->notify` refuses more).
pub const MAX_NOTIFICATION: usize = 4096;

/// Notifications of one data message a node sends at most, and a server
/// relays at most (4 KiB each at most, so 1 MiB): a handler that notifies
/// in a loop, or a node that ignores the bound, cannot fill a worker's, a
/// node's or the server's memory. The rest are counted and dropped; the
/// message itself is unaffected.
pub const MAX_PER_MESSAGE: usize = 256;

/// Bytes before the notification's data: id and set.
pub const NOTIFICATION_HEAD: usize = 5;

/// One handler notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The data message it concerns.
    pub id: u32,
    /// Index of the handler set (execution context) that sent it.
    pub set: u8,
    pub data: Bytes,
}

impl Notification {
    /// Check-then-parse: the length is checked before anything is read;
    /// the data is shared with the payload, not copied.
    pub fn parse(payload: Bytes) -> Result<Self, ProtocolError> {
        if payload.len() < NOTIFICATION_HEAD {
            return Err(ProtocolError::Truncated {
                what: "notification",
                got: payload.len(),
                need: NOTIFICATION_HEAD,
            });
        }
        let len = payload.len() - NOTIFICATION_HEAD;
        if len > MAX_NOTIFICATION {
            return Err(ProtocolError::BadNotification(format!(
                "{len} bytes, more than the {MAX_NOTIFICATION} a notification may hold"
            )));
        }
        Ok(Notification {
            id: u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]),
            set: payload[4],
            data: payload.slice(NOTIFICATION_HEAD..),
        })
    }

    /// The same notification with another id (the server's mapping from a
    /// node-side id to the user's), its data still shared.
    pub fn with_id(&self, id: u32) -> Self {
        Notification {
            id,
            set: self.set,
            data: self.data.clone(),
        }
    }

    /// Refuses data longer than [`MAX_NOTIFICATION`] (nothing else can fail).
    pub fn to_frame(&self) -> Result<OutFrame, ProtocolError> {
        if self.data.len() > MAX_NOTIFICATION {
            return Err(ProtocolError::BadNotification(format!(
                "{} bytes, more than the {MAX_NOTIFICATION} a notification may hold",
                self.data.len()
            )));
        }
        let mut head = [0u8; NOTIFICATION_HEAD];
        head[..4].copy_from_slice(&self.id.to_le_bytes());
        head[4] = self.set;
        OutFrame::with_prefix(MsgType::Notification, &head, self.data.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_shares_the_data() {
        let n = Notification {
            id: 0x0102_0304,
            set: 2,
            data: Bytes::from_static(b"tail:4096"),
        };
        let v = n.to_frame().unwrap().to_vec();
        assert_eq!(&v[..8], &[0x1C, 0, 0, 0, 14, 0, 0, 0]);
        assert_eq!(&v[8..13], &[4, 3, 2, 1, 2]);
        let back = Notification::parse(Bytes::copy_from_slice(&v[8..])).unwrap();
        assert_eq!(back, n);
        assert_eq!(back.with_id(9).id, 9);
        assert_eq!(back.with_id(9).data, n.data);
    }

    #[test]
    fn bounds_are_checked_before_reading() {
        for short in 0..NOTIFICATION_HEAD {
            let e = Notification::parse(Bytes::from(vec![0; short])).unwrap_err();
            assert_eq!(e.kind(), "truncated");
        }
        let empty = Notification::parse(Bytes::from(vec![0; NOTIFICATION_HEAD])).unwrap();
        assert!(empty.data.is_empty());
        let full = vec![7; NOTIFICATION_HEAD + MAX_NOTIFICATION];
        assert_eq!(
            Notification::parse(Bytes::from(full)).unwrap().data.len(),
            4096
        );
        let over = vec![7; NOTIFICATION_HEAD + MAX_NOTIFICATION + 1];
        let e = Notification::parse(Bytes::from(over)).unwrap_err();
        assert_eq!(e.kind(), "bad_notification");
        let big = Notification {
            id: 1,
            set: 0,
            data: Bytes::from(vec![0; MAX_NOTIFICATION + 1]),
        };
        assert!(big.to_frame().is_err());
    }
}
