//! Resource quantities (`100m`, `1.5Gi`, `2e3`) as Kubernetes writes them: parsed exactly to
//! nano-units, compared by value, and printed in Kubernetes' canonical form.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;
/// Largest magnitude accepted, in nano-units: 2^63 units, as Kubernetes' int64-backed
/// quantities allow.
const MAX_NANOS: i128 = (i64::MAX as i128 + 1) * NANO;

/// How a quantity was written, which decides how it is printed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Powers of 1024: `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`.
    BinarySI,
    /// Powers of 1000: `n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`.
    DecimalSI,
    /// `e<n>` / `E<n>` exponents.
    DecimalExponent,
}

/// A quantity: an exact value in nano-units plus the format it was written in.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the form `<number><suffix>`.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {0:?})"
    )]
    Syntax(String),
    /// An unknown suffix.
    #[error("unable to parse quantity's suffix {suffix:?} in {input:?}")]
    Suffix {
        /// The suffix.
        suffix: String,
        /// The whole input.
        input: String,
    },
    /// Larger than Kubernetes can hold.
    #[error("quantity {0:?} is too large")]
    TooLarge(String),
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: Format::DecimalSI,
    };

    /// A whole number of units in decimal format (`cpu: 2`, `pods: 110`).
    pub fn from_units(units: i64) -> Quantity {
        Quantity {
            nanos: units as i128 * NANO,
            format: Format::DecimalSI,
        }
    }

    /// Thousandths of a unit (`250m`).
    pub fn from_milli(milli: i64) -> Quantity {
        Quantity {
            nanos: milli as i128 * 1_000_000,
            format: Format::DecimalSI,
        }
    }

    /// A number of bytes in binary format (`1Gi`).
    pub fn from_bytes(bytes: i64) -> Quantity {
        Quantity {
            nanos: bytes as i128 * NANO,
            format: Format::BinarySI,
        }
    }

    /// The format it prints in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The value in thousandths, rounded up (how CPU is accounted: `0.1` → 100).
    pub fn milli_ceil(&self) -> i64 {
        clamp(div_ceil(self.nanos, 1_000_000))
    }

    /// The value in whole units, rounded up (how memory and counts are accounted).
    pub fn units_ceil(&self) -> i64 {
        clamp(div_ceil(self.nanos, NANO))
    }

    /// The sum of two quantities, in the format of the first.
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: (self.nanos + other.nanos).clamp(-MAX_NANOS, MAX_NANOS),
            format: self.format,
        }
    }

    /// How many whole `each` fit in this quantity (`None` when `each` is zero or less: any
    /// number does).
    pub fn count_within(self, each: Quantity) -> Option<u64> {
        if each.nanos <= 0 {
            return None;
        }
        Some((self.nanos.max(0) / each.nanos).min(u64::MAX as i128) as u64)
    }

    /// This quantity `n` times, saturating.
    pub fn times(self, n: u64) -> Quantity {
        Quantity {
            nanos: self
                .nanos
                .saturating_mul(n.min(i64::MAX as u64) as i128)
                .clamp(-MAX_NANOS, MAX_NANOS),
            format: self.format,
        }
    }

    /// The difference of two quantities, never below zero, in the format of the first.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: (self.nanos - other.nanos).clamp(0, MAX_NANOS),
            format: self.format,
        }
    }
}

fn div_ceil(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d > 0 { q + 1 } else { q }
}

fn clamp(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// The multiplier of a suffix, as (format, base, exponent): value × base^exponent.
fn suffix(s: &str) -> Option<(Format, i128, u32, bool)> {
    // (format, base, power, negative power)
    Some(match s {
        "" => (Format::DecimalSI, 10, 0, false),
        "n" => (Format::DecimalSI, 10, 9, true),
        "u" => (Format::DecimalSI, 10, 6, true),
        "m" => (Format::DecimalSI, 10, 3, true),
        "k" => (Format::DecimalSI, 10, 3, false),
        "M" => (Format::DecimalSI, 10, 6, false),
        "G" => (Format::DecimalSI, 10, 9, false),
        "T" => (Format::DecimalSI, 10, 12, false),
        "P" => (Format::DecimalSI, 10, 15, false),
        "E" => (Format::DecimalSI, 10, 18, false),
        "Ki" => (Format::BinarySI, 1024, 1, false),
        "Mi" => (Format::BinarySI, 1024, 2, false),
        "Gi" => (Format::BinarySI, 1024, 3, false),
        "Ti" => (Format::BinarySI, 1024, 4, false),
        "Pi" => (Format::BinarySI, 1024, 5, false),
        "Ei" => (Format::BinarySI, 1024, 6, false),
        _ => {
            let rest = s.strip_prefix(['e', 'E'])?;
            let exp: i32 = rest.parse().ok()?;
            if !(-30..=30).contains(&exp) {
                return None;
            }
            (Format::DecimalExponent, 10, exp.unsigned_abs(), exp < 0)
        }
    })
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(input: &str) -> Result<Quantity, QuantityError> {
        let syntax = || QuantityError::Syntax(input.to_owned());
        let (negative, body) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            Some(_) => (false, input),
            None => return Err(syntax()),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix_str) = body.split_at(num_end);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
            return Err(syntax());
        }
        let (format, base, power, negative_power) =
            suffix(suffix_str).ok_or_else(|| QuantityError::Suffix {
                suffix: suffix_str.to_owned(),
                input: input.to_owned(),
            })?;
        let too_large = || QuantityError::TooLarge(input.to_owned());
        // digits as an integer mantissa with `scale` decimal places.
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 36 {
            return Err(too_large());
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| too_large())?
        };
        // value = mantissa × 10^-scale × base^±power, in nanos = × 10^9.
        let mut num = mantissa;
        let mut den: i128 = 10i128.pow(frac_part.len() as u32);
        num = num.checked_mul(NANO).ok_or_else(too_large)?;
        let factor = base.checked_pow(power).ok_or_else(too_large)?;
        if negative_power {
            den = den.checked_mul(factor).ok_or_else(too_large)?;
        } else {
            num = num.checked_mul(factor).ok_or_else(too_large)?;
        }
        // Precision beyond a nano-unit is rounded up, as Kubernetes does.
        let nanos = div_ceil(num, den);
        if nanos > MAX_NANOS {
            return Err(too_large());
        }
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }
}

impl fmt::Display for Quantity {
    /// Kubernetes' canonical form: the largest suffix of the quantity's format that keeps the
    /// number whole (`1500m`, `1536Mi`, `1500k`, `12e6`); binary quantities that are not whole
    /// bytes or are under 1Ki print in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.abs();
        let mut format = self.format;
        if format == Format::BinarySI && (abs % NANO != 0 || abs < 1024 * NANO) {
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut units = abs / NANO;
            let mut k = 0;
            while k < 6 && units % 1024 == 0 {
                units /= 1024;
                k += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][k];
            return write!(f, "{sign}{units}{suffix}");
        }
        // Decimal: the largest exponent e (multiple of 3, from -9 up) with a whole mantissa.
        let mut mantissa = abs;
        let mut exp = -9i32;
        while exp < 18 && mantissa % 1000 == 0 {
            mantissa /= 1000;
            exp += 3;
        }
        match format {
            Format::DecimalExponent => {
                if exp == 0 {
                    write!(f, "{sign}{mantissa}")
                } else {
                    write!(f, "{sign}{mantissa}e{exp}")
                }
            }
            _ => {
                let suffix = match exp {
                    -9 => "n",
                    -6 => "u",
                    -3 => "m",
                    0 => "",
                    3 => "k",
                    6 => "M",
                    9 => "G",
                    12 => "T",
                    15 => "P",
                    _ => "E",
                };
                write!(f, "{sign}{mantissa}{suffix}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn counts_and_multiples() {
        assert_eq!(q("10").count_within(q("4")), Some(2));
        assert_eq!(q("1").count_within(q("250m")), Some(4));
        assert_eq!(q("1Gi").count_within(q("300Mi")), Some(3));
        assert_eq!(q("0").count_within(q("1")), Some(0));
        assert_eq!(q("5").count_within(q("0")), None);
        assert_eq!(q("250m").times(4), q("1"));
        assert_eq!(q("1Gi").times(2).to_string(), "2Gi");
    }

    #[test]
    fn parses_and_prints_like_kubernetes() {
        for (input, canonical) in [
            ("0", "0"),
            ("100m", "100m"),
            ("0.1", "100m"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("2", "2"),
            ("1Ki", "1Ki"),
            ("1024", "1024"),
            ("1.5Gi", "1536Mi"),
            ("1536", "1536"),
            ("0.5Ki", "512"),
            ("1500000", "1500k"),
            ("1M", "1M"),
            ("12e6", "12e6"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("-5m", "-5m"),
            ("+3", "3"),
            ("0.0000000001", "1n"),
            ("5.", "5"),
            (".5", "500m"),
            ("1Ei", "1Ei"),
        ] {
            assert_eq!(q(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn accounting_rounds_up() {
        assert_eq!(q("100m").milli_ceil(), 100);
        assert_eq!(q("0.1").milli_ceil(), 100);
        assert_eq!(q("1.0001m").milli_ceil(), 2);
        assert_eq!(q("1Gi").units_ceil(), 1 << 30);
        assert_eq!(q("1.5").units_ceil(), 2);
        assert_eq!(q("-1.5").units_ceil(), -1);
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1000m"), q("1"));
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in [
            "", "-", "abc", "1.2.3", "1Zi", "1 Gi", "Gi", "1e", "1e99", "1KiB", ".",
        ] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?}");
        }
        assert!(matches!(
            "100000000000000000000E".parse::<Quantity>(),
            Err(QuantityError::TooLarge(_))
        ));
    }

    proptest! {
        /// Printing and parsing again gives the same value, and printing is stable.
        #[test]
        fn canonical_form_round_trips(
            mantissa in -1_000_000i64..1_000_000,
            frac in proptest::option::of(0u32..1000),
            suffix in proptest::sample::select(vec![
                "", "n", "u", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "e3", "e-3", "E6",
            ]),
        ) {
            let text = match frac {
                Some(f) => format!("{mantissa}.{f:03}{suffix}"),
                None => format!("{mantissa}{suffix}"),
            };
            let parsed: Quantity = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            let printed = parsed.to_string();
            let again: Quantity = printed.parse().map_err(|e| TestCaseError::fail(format!("{printed}: {e}")))?;
            prop_assert_eq!(again, parsed, "{} printed as {}", text, printed);
            prop_assert_eq!(again.to_string(), printed);
        }
    }
}
