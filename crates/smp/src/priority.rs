//! A priority class as a 4-bit field, where group commands
//! (the high nibble of the command byte) and collective headers (byte 9)
//! carry one: fields that older senders write as 0, so 0 must keep
//! meaning "the default class" and the other classes need a marker bit.

use crate::stream::{CLASSES, DEFAULT_CLASS};

/// A priority class as a 4-bit field of a group command or a collective
/// header: 0 is "none given", the default class, which is what a sender
/// that predates classes writes; otherwise 8 + class. The default class
/// is written as 0 (never 8 + 4), so default traffic is byte for byte what
/// it was and every class has one encoding.
pub fn class_field(class: u8) -> u8 {
    match class.min(CLASSES - 1) {
        DEFAULT_CLASS => 0,
        c => 8 | c,
    }
}

/// The class a 4-bit field names, or `None` for a value no sender writes
/// (1–7, and 8 + 4).
pub fn class_from_field(field: u8) -> Option<u8> {
    match field & 0x0F {
        0 => Some(DEFAULT_CLASS),
        f if f & 8 != 0 && f & 7 != DEFAULT_CLASS => Some(f & 7),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_has_one_field_and_back() {
        for class in 0..CLASSES {
            let f = class_field(class);
            assert_eq!(class_from_field(f), Some(class));
            assert_eq!(f == 0, class == DEFAULT_CLASS);
        }
        assert_eq!(class_field(9), class_field(7), "clamped");
        for never in [1, 2, 7, 8 | DEFAULT_CLASS] {
            assert_eq!(class_from_field(never), None, "{never}");
        }
    }
}
