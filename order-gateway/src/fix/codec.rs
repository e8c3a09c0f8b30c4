//! FIX 4.4 tag=value framing, validation and encoding.
//!
//! [`split_frame`] finds one complete message at the front of a byte stream and validates
//! BeginString, BodyLength and CheckSum; [`Message`] is a zero-copy view of a validated frame
//! whose fields are iterated in place; a data field (RawData, XmlData, EncodedText...) is
//! read by the length its length field declares, so it may hold SOH. [`MessageWriter`] encodes into a reused buffer and
//! computes BodyLength and CheckSum; it never allocates once its buffer has grown.

use std::fmt::Write as _;

/// Field separator.
pub const SOH: u8 = 0x01;
const BEGIN: &[u8] = b"8=FIX.4.4\x01";

/// Why bytes are not a FIX message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FixError {
    /// More bytes needed.
    #[error("incomplete frame")]
    Incomplete,
    /// The stream does not start with `8=FIX.4.4`; `skip` bytes to the next candidate.
    #[error("bad BeginString")]
    BadBeginString {
        /// Bytes to drop before trying again.
        skip: usize,
    },
    /// BodyLength missing, not a number, or not ending where `10=` starts.
    #[error("bad BodyLength")]
    BadBodyLength {
        /// Bytes to drop before trying again.
        skip: usize,
    },
    /// CheckSum does not match.
    #[error("bad CheckSum")]
    BadChecksum {
        /// Length of the (garbled) frame.
        skip: usize,
    },
    /// A field is not `tag=value` with a numeric tag.
    #[error("malformed field at byte {0}")]
    BadField(usize),
    /// A data field (RawData, XmlData, EncodedText...) whose length field is not a number,
    /// or whose declared length runs past the message or does not end at a SOH: a garbled
    /// message.
    #[error("data field at byte {0} does not match its declared length")]
    BadDataLength(usize),
    /// A required field is missing.
    #[error("missing tag {0}")]
    MissingTag(u32),
    /// A field value does not parse.
    #[error("bad value for tag {0}")]
    BadValue(u32),
    /// A well-framed message (BodyLength and CheckSum right) whose BeginString is another
    /// FIX version's: not garbled, the peer speaks another version (FIX 4.4 Vol. 2: Logout,
    /// then disconnect).
    #[error("BeginString is not FIX.4.4")]
    WrongBeginString {
        /// Length of the frame.
        len: usize,
    },
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Where to resume after garbage at the front of `buf`: the next `8=FIX` after byte 0.
fn resync(buf: &[u8]) -> usize {
    find(&buf[1..], b"8=FIX").map_or(buf.len(), |i| i + 1)
}

pub(crate) fn parse_uint(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u64::from(c - b'0'))
    })
}

/// Longest BeginString field framed (`8=FIXT.1.1` and its SOH is 11 bytes).
const MAX_BEGIN: usize = 16;

/// Validates the message at the front of `buf` and returns its length. A frame that is
/// whole and sound but whose BeginString is not `FIX.4.4` is
/// [`FixError::WrongBeginString`], not garbled.
pub fn split_frame(buf: &[u8]) -> Result<usize, FixError> {
    const PREFIX: &[u8] = b"8=FIX";
    let n = buf.len().min(PREFIX.len());
    if buf[..n] != PREFIX[..n] {
        return Err(FixError::BadBeginString { skip: resync(buf) });
    }
    let Some(soh) = buf.iter().take(MAX_BEGIN).position(|&c| c == SOH) else {
        return if buf.len() >= MAX_BEGIN {
            Err(FixError::BadBeginString { skip: resync(buf) })
        } else {
            Err(FixError::Incomplete)
        };
    };
    let begin_len = soh + 1;
    if buf.len() < begin_len + 2 {
        return Err(FixError::Incomplete);
    }
    let rest = &buf[begin_len..];
    if &rest[..2] != b"9=" {
        return Err(FixError::BadBodyLength { skip: resync(buf) });
    }
    let Some(soh) = rest.iter().position(|&c| c == SOH) else {
        return if rest.len() > 10 {
            Err(FixError::BadBodyLength { skip: resync(buf) })
        } else {
            Err(FixError::Incomplete)
        };
    };
    let body_len = match parse_uint(&rest[2..soh]) {
        Some(v) if v <= 1 << 20 => v as usize,
        _ => return Err(FixError::BadBodyLength { skip: resync(buf) }),
    };
    let body_start = begin_len + soh + 1;
    let trailer = body_start + body_len;
    let end = trailer + 7;
    if buf.len() < end {
        return Err(FixError::Incomplete);
    }
    let t = &buf[trailer..end];
    if &t[..3] != b"10=" || t[6] != SOH {
        return Err(FixError::BadBodyLength { skip: resync(buf) });
    }
    let Some(declared) = parse_uint(&t[3..6]) else {
        return Err(FixError::BadChecksum { skip: end });
    };
    let sum = buf[..trailer].iter().fold(0u32, |a, &b| a + u32::from(b)) % 256;
    if u64::from(sum) != declared {
        return Err(FixError::BadChecksum { skip: end });
    }
    if buf[..begin_len] != *BEGIN {
        return Err(FixError::WrongBeginString { len: end });
    }
    Ok(end)
}

/// Fields indexed when a message is parsed (an execution report has about 20); a tag not
/// among them is looked for in the text after them.
const INDEXED: usize = 24;

/// A validated FIX message (a view into the receive buffer).
///
/// Its first `INDEXED` (24) fields are indexed once, when parsed, so looking a tag up costs a
/// scan of a small array rather than a re-parse of the text (an execution report is asked
/// for about ten tags).
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    raw: &'a [u8],
    /// Body fields: after BodyLength, before CheckSum.
    body: &'a [u8],
    /// `(tag, value offset in body, value length)` of the first `indexed` fields, in order.
    index: [(u32, u32, u32); INDEXED],
    indexed: u8,
    /// Every field of the body is in `index`.
    complete: bool,
}

/// The data field a FIX 4.4 length field announces: its value is read by that length, as
/// it may hold SOH (FIX 4.4 Vol. 1, data type `data`; QuickFIX does the same).
pub fn data_field_of(length_tag: u32) -> Option<u32> {
    Some(match length_tag {
        90 => 91,   // SecureDataLen -> SecureData
        93 => 89,   // SignatureLength -> Signature
        95 => 96,   // RawDataLength -> RawData
        212 => 213, // XmlDataLen -> XmlData
        348 => 349, // EncodedIssuerLen -> EncodedIssuer
        350 => 351, // EncodedSecurityDescLen -> EncodedSecurityDesc
        352 => 353, // EncodedListExecInstLen -> EncodedListExecInst
        354 => 355, // EncodedTextLen -> EncodedText
        356 => 357, // EncodedSubjectLen -> EncodedSubject
        358 => 359, // EncodedHeadlineLen -> EncodedHeadline
        360 => 361, // EncodedAllocTextLen -> EncodedAllocText
        362 => 363, // EncodedUnderlyingIssuerLen -> EncodedUnderlyingIssuer
        364 => 365, // EncodedUnderlyingSecurityDescLen -> EncodedUnderlyingSecurityDesc
        445 => 446, // EncodedListStatusTextLen -> EncodedListStatusText
        618 => 619, // EncodedLegIssuerLen -> EncodedLegIssuer
        621 => 622, // EncodedLegSecurityDescLen -> EncodedLegSecurityDesc
        _ => return None,
    })
}

/// Iterator over `(tag, value)` of a message body. A data field announced by the length
/// field before it ([`data_field_of`]) is read by that length, SOH included.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
    offset: usize,
    /// After a length field: the data tag it announces and its value (`None`: not a
    /// number).
    data: Option<(u32, Option<usize>)>,
}

impl<'a> Fields<'a> {
    /// The field at the front is the data field announced, of `len` bytes (`None`: the
    /// length was not a number): its value, or a garbled message.
    fn data_value(
        &mut self,
        at: usize,
        eq: usize,
        len: Option<usize>,
    ) -> Result<&'a [u8], FixError> {
        let start = eq + 1;
        let end = len.and_then(|n| start.checked_add(n));
        match end {
            Some(end) if end > start && self.rest.get(end) == Some(&SOH) => {
                let value = &self.rest[start..end];
                self.rest = &self.rest[end + 1..];
                self.offset += end + 1;
                Ok(value)
            }
            _ => {
                self.rest = &[];
                Err(FixError::BadDataLength(at))
            }
        }
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, &'a [u8]), FixError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let at = self.offset;
        if let Some((data_tag, len)) = self.data {
            let eq = self.rest.iter().position(|&c| c == b'=' || c == SOH);
            if let Some(eq) = eq.filter(|&eq| self.rest[eq] == b'=') {
                if parse_uint(&self.rest[..eq]) == Some(u64::from(data_tag)) {
                    self.data = None;
                    return Some(self.data_value(at, eq, len).map(|v| (data_tag, v)));
                }
            }
        }
        let Some(end) = self.rest.iter().position(|&c| c == SOH) else {
            self.rest = &[];
            return Some(Err(FixError::BadField(at)));
        };
        let field = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        self.offset += end + 1;
        let Some(eq) = field.iter().position(|&c| c == b'=') else {
            return Some(Err(FixError::BadField(at)));
        };
        match parse_uint(&field[..eq]) {
            Some(tag) if tag > 0 && tag < u64::from(u32::MAX) && eq + 1 < field.len() => {
                let (tag, value) = (tag as u32, &field[eq + 1..]);
                if let Some(data_tag) = data_field_of(tag) {
                    let len = parse_uint(value).and_then(|n| usize::try_from(n).ok());
                    self.data = Some((data_tag, len));
                }
                Some(Ok((tag, value)))
            }
            _ => Some(Err(FixError::BadField(at))),
        }
    }
}

impl<'a> Message<'a> {
    /// Views a frame already validated by [`split_frame`]; checks every field's syntax and
    /// that MsgType comes first.
    pub fn parse(frame: &'a [u8]) -> Result<Message<'a>, FixError> {
        let soh = frame[BEGIN.len()..]
            .iter()
            .position(|&c| c == SOH)
            .ok_or(FixError::BadBodyLength { skip: 0 })?;
        let body_start = BEGIN.len() + soh + 1;
        let body_end = frame
            .len()
            .checked_sub(7)
            .filter(|&e| e >= body_start)
            .ok_or(FixError::Incomplete)?;
        let mut m = Message {
            raw: frame,
            body: &frame[body_start..body_end],
            index: [(0, 0, 0); INDEXED],
            indexed: 0,
            complete: true,
        };
        let mut first = true;
        let base = m.body.as_ptr() as usize;
        for f in m.fields() {
            let (tag, value) = f?;
            if first && tag != super::tag::MSG_TYPE {
                return Err(FixError::MissingTag(super::tag::MSG_TYPE));
            }
            first = false;
            let n = usize::from(m.indexed);
            if n < INDEXED {
                // `value` is a subslice of `body` (a frame is at most a few MiB).
                let at = (value.as_ptr() as usize - base) as u32;
                m.index[n] = (tag, at, value.len() as u32);
                m.indexed += 1;
            } else {
                m.complete = false;
            }
        }
        if first {
            return Err(FixError::MissingTag(super::tag::MSG_TYPE));
        }
        Ok(m)
    }

    /// The whole frame.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The body fields in order, MsgType first.
    pub fn fields(&self) -> Fields<'a> {
        Fields {
            rest: self.body,
            offset: 0,
            data: None,
        }
    }

    /// First value of `tag`.
    pub fn get(&self, tag: u32) -> Option<&'a [u8]> {
        let body = self.body;
        if let Some(&(_, at, len)) = self.index[..usize::from(self.indexed)]
            .iter()
            .find(|(t, _, _)| *t == tag)
        {
            return body.get(at as usize..(at as usize).checked_add(len as usize)?);
        }
        if self.complete {
            return None;
        }
        self.fields()
            .flatten()
            .skip(INDEXED)
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v)
    }

    /// Value of a required tag.
    pub fn require(&self, tag: u32) -> Result<&'a [u8], FixError> {
        self.get(tag).ok_or(FixError::MissingTag(tag))
    }

    /// Required unsigned integer tag.
    pub fn uint(&self, tag: u32) -> Result<u64, FixError> {
        parse_uint(self.require(tag)?).ok_or(FixError::BadValue(tag))
    }

    /// Required price (decimal) as fixed point with 4 implied decimals.
    pub fn price(&self, tag: u32) -> Result<i64, FixError> {
        parse_price(self.require(tag)?).ok_or(FixError::BadValue(tag))
    }

    /// MsgType.
    pub fn msg_type(&self) -> &'a [u8] {
        self.get(super::tag::MSG_TYPE).unwrap_or(b"")
    }

    /// MsgSeqNum, if present and numeric.
    pub fn seq(&self) -> Option<u64> {
        self.get(super::tag::MSG_SEQ_NUM).and_then(parse_uint)
    }

    /// PossDupFlag = Y.
    pub fn poss_dup(&self) -> bool {
        self.get(super::tag::POSS_DUP_FLAG) == Some(b"Y")
    }
}

/// Parses a FIX decimal into 4-decimal fixed point (extra decimals are truncated).
pub fn parse_price(v: &[u8]) -> Option<i64> {
    let (neg, v) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        _ => (false, v),
    };
    let (int, frac) = match v.iter().position(|&c| c == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if int.is_empty() || int.len() > 14 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut x = parse_uint(int)? as i64 * crate::proto::PRICE_SCALE;
    let mut scale = crate::proto::PRICE_SCALE / 10;
    for &c in frac.iter().take(4) {
        x += i64::from(c - b'0') * scale;
        scale /= 10;
    }
    Some(if neg { -x } else { x })
}

/// Formats nanoseconds since the epoch as a FIX UTCTimestamp `YYYYMMDD-HH:MM:SS.sss`.
pub fn write_utc_timestamp(out: &mut Vec<u8>, unix_nanos: u64) {
    let secs = unix_nanos / 1_000_000_000;
    let millis = (unix_nanos / 1_000_000) % 1000;
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mut s = arrayvec_string();
    let _ = write!(
        s,
        "{y:04}{m:02}{d:02}-{:02}:{:02}:{:02}.{millis:03}",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    );
    out.extend_from_slice(s.as_bytes());
}

/// The Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i32 = time::OffsetDateTime::UNIX_EPOCH.to_julian_day();

/// Parses a FIX UTCTimestamp `YYYYMMDD-HH:MM:SS` with optional fractional seconds (`.sss`,
/// `.ssssss` or `.sssssssss`, as FIX 4.4 and later and QuickFIX accept) into nanoseconds
/// since the epoch. `None` for anything else, out-of-range fields included (a leap second,
/// `:60`, is accepted and counts as the next second).
pub fn parse_utc_timestamp(v: &[u8]) -> Option<u64> {
    if v.len() < 17 || v[8] != b'-' || v[11] != b':' || v[14] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| parse_uint(&v[r]);
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, sec) = (num(9..11)?, num(12..14)?, num(15..17)?);
    let frac = match &v[17..] {
        [] => 0,
        [b'.', digits @ ..] if matches!(digits.len(), 3 | 6 | 9) => {
            parse_uint(digits)? * 10u64.pow(9 - digits.len() as u32)
        }
        _ => return None,
    };
    if !(1970..=9999).contains(&y) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // The calendar (month lengths, leap years) is the `time` crate's.
    let month = time::Month::try_from(u8::try_from(mo).ok()?).ok()?;
    let date = time::Date::from_calendar_date(y as i32, month, u8::try_from(d).ok()?).ok()?;
    let days = u64::try_from(date.to_julian_day() - UNIX_EPOCH_JULIAN_DAY).ok()?;
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec) * 1_000_000_000) + frac)
}

/// A fixed-capacity string on the stack, so formatting timestamps does not allocate.
fn arrayvec_string() -> StackStr {
    StackStr {
        buf: [0; 32],
        len: 0,
    }
}

struct StackStr {
    buf: [u8; 32],
    len: usize,
}

impl StackStr {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for StackStr {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Encodes messages: `start`, then fields, then `finish` appends the framed message.
#[derive(Debug, Default)]
pub struct MessageWriter {
    body: Vec<u8>,
}

impl MessageWriter {
    /// Starts a message of type `msg_type`.
    pub fn start(&mut self, msg_type: &[u8]) -> &mut Self {
        self.body.clear();
        self.field(super::tag::MSG_TYPE, msg_type)
    }

    /// Appends raw `tag=value`.
    pub fn field(&mut self, tag: u32, value: &[u8]) -> &mut Self {
        self.uint_raw(u64::from(tag));
        self.body.push(b'=');
        self.body.extend_from_slice(value);
        self.body.push(SOH);
        self
    }

    /// Appends a pre-encoded run of `tag=value\x01` fields.
    pub fn raw_fields(&mut self, fields: &[u8]) -> &mut Self {
        self.body.extend_from_slice(fields);
        self
    }

    fn uint_raw(&mut self, v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = v;
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.body.extend_from_slice(&digits[i..]);
    }

    /// Appends an unsigned integer field.
    pub fn uint(&mut self, tag: u32, v: u64) -> &mut Self {
        self.uint_raw(u64::from(tag));
        self.body.push(b'=');
        self.uint_raw(v);
        self.body.push(SOH);
        self
    }

    /// Appends a price (4-decimal fixed point) as a FIX decimal.
    pub fn price(&mut self, tag: u32, px: i64) -> &mut Self {
        self.uint_raw(u64::from(tag));
        self.body.push(b'=');
        if px < 0 {
            self.body.push(b'-');
        }
        let a = px.unsigned_abs();
        let scale = crate::proto::PRICE_SCALE as u64;
        self.uint_raw(a / scale);
        let frac = a % scale;
        self.body.push(b'.');
        let mut s = scale / 10;
        while s > 0 {
            self.body.push(b'0' + ((frac / s) % 10) as u8);
            s /= 10;
        }
        self.body.push(SOH);
        self
    }

    /// Appends a UTCTimestamp field.
    pub fn timestamp(&mut self, tag: u32, unix_nanos: u64) -> &mut Self {
        self.uint_raw(u64::from(tag));
        self.body.push(b'=');
        write_utc_timestamp(&mut self.body, unix_nanos);
        self.body.push(SOH);
        self
    }

    /// Appends the framed message (BeginString, BodyLength, body, CheckSum) to `out` and
    /// returns its start offset in `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(BEGIN);
        out.extend_from_slice(b"9=");
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut v = self.body.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        out.extend_from_slice(&digits[i..]);
        out.push(SOH);
        out.extend_from_slice(&self.body);
        let sum = out[start..].iter().fold(0u32, |a, &b| a + u32::from(b)) % 256;
        out.extend_from_slice(&[
            b'1',
            b'0',
            b'=',
            b'0' + (sum / 100) as u8,
            b'0' + (sum / 10 % 10) as u8,
            b'0' + (sum % 10) as u8,
            SOH,
        ]);
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat computed by hand: body "35=0|49=A|56=B|34=1|52=20240102-15:00:00.000|" is
    /// 45 bytes; checksum of everything before "10=".
    fn heartbeat() -> Vec<u8> {
        b"8=FIX.4.4\x019=45\x0135=0\x0149=A\x0156=B\x0134=1\x0152=20240102-15:00:00.000\x0110="
            .to_vec()
    }

    fn with_checksum(mut v: Vec<u8>) -> Vec<u8> {
        let sum = v[..v.len() - 3].iter().map(|&b| u32::from(b)).sum::<u32>() % 256;
        v.extend_from_slice(format!("{sum:03}\x01").as_bytes());
        v
    }

    #[test]
    fn encodes_known_bytes() {
        let mut w = MessageWriter::default();
        w.start(b"0")
            .field(49, b"A")
            .field(56, b"B")
            .uint(34, 1)
            .timestamp(52, 1_704_207_600_000_000_000);
        let mut out = Vec::new();
        w.finish(&mut out);
        assert_eq!(out, with_checksum(heartbeat()));
        assert_eq!(split_frame(&out), Ok(out.len()));
    }

    #[test]
    fn decodes_fields_zero_copy() {
        let f = with_checksum(heartbeat());
        let m = Message::parse(&f).unwrap();
        assert_eq!(m.msg_type(), b"0");
        assert_eq!(m.seq(), Some(1));
        assert_eq!(m.get(49), Some(&b"A"[..]));
        let tags: Vec<u32> = m.fields().map(|f| f.unwrap().0).collect();
        assert_eq!(tags, [35, 49, 56, 34, 52]);
    }

    /// Lookups give the first value of a tag, inside the index and past it, and agree with
    /// a plain scan of the fields.
    #[test]
    fn lookups_past_the_index_agree_with_a_scan() {
        let mut w = MessageWriter::default();
        w.start(b"8").field(49, b"V").field(56, b"G").uint(34, 7);
        for i in 0..40u64 {
            w.uint(5000 + (i % 30) as u32, i);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        let m = Message::parse(&out).unwrap();
        let scan = |tag: u32| {
            m.fields()
                .flatten()
                .find(|(t, _)| *t == tag)
                .map(|(_, v)| v)
        };
        for tag in [35, 49, 56, 34, 5000, 5009, 5020, 5025, 5029, 5030, 9, 10, 1] {
            assert_eq!(m.get(tag), scan(tag), "tag {tag}");
        }
        assert_eq!(m.get(5025), Some(&b"25"[..]));
        assert_eq!(m.get(5005), Some(&b"5"[..]));
        assert_eq!(m.get(4999), None);
        assert_eq!(m.seq(), Some(7));
    }

    #[test]
    fn validation() {
        let good = with_checksum(heartbeat());
        for n in 0..good.len() {
            assert_eq!(
                split_frame(&good[..n]),
                Err(FixError::Incomplete),
                "prefix {n}"
            );
        }
        let mut bad = good.clone();
        let l = bad.len();
        bad[l - 2] = if bad[l - 2] == b'9' { b'8' } else { b'9' };
        assert_eq!(split_frame(&bad), Err(FixError::BadChecksum { skip: l }));
        // Another version's BeginString: garbled if its CheckSum is wrong, otherwise a
        // sound frame of the wrong version.
        let mut bad = good.clone();
        bad[7] = b'2'; // FIX.4.2
        assert!(matches!(
            split_frame(&bad),
            Err(FixError::BadChecksum { .. })
        ));
        let fix42 = with_checksum(bad[..bad.len() - 4].to_vec());
        assert_eq!(
            split_frame(&fix42),
            Err(FixError::WrongBeginString { len: fix42.len() })
        );
        assert!(matches!(
            split_frame(b"8=FIX.4.4.4.4.4.4.4.4\x019=5\x01"),
            Err(FixError::BadBeginString { .. })
        ));
        let mut short = heartbeat();
        short[13] = b'4'; // 9=44: the trailer no longer starts where BodyLength says
        let bad = with_checksum(short);
        assert!(matches!(
            split_frame(&bad),
            Err(FixError::BadBodyLength { .. })
        ));
        // Garbage then a good frame: resync lands on the frame.
        let mut stream = b"xx8=FIY".to_vec();
        stream.extend_from_slice(&good);
        let Err(FixError::BadBeginString { skip }) = split_frame(&stream) else {
            panic!()
        };
        assert_eq!(split_frame(&stream[skip..]), Ok(good.len()));
    }

    #[test]
    fn parse_rejects_bad_fields() {
        let f = with_checksum(b"8=FIX.4.4\x019=9\x0135=0\x01x=1\x0110=".to_vec());
        assert_eq!(split_frame(&f), Ok(f.len()));
        assert_eq!(Message::parse(&f).unwrap_err(), FixError::BadField(5));
        let f = with_checksum(b"8=FIX.4.4\x019=5\x0134=1\x0110=".to_vec());
        assert_eq!(Message::parse(&f).unwrap_err(), FixError::MissingTag(35));
    }

    /// A body with `fields` (values written as given, SOH included), framed.
    fn framed(fields: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(b"8").field(49, b"V").field(56, b"G").uint(34, 7);
        for (t, v) in fields {
            w.field(*t, v);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        out
    }

    /// RawData and XmlData holding SOH (and what looks like fields, a CheckSum included) are
    /// read by their declared lengths; the fields after them are read as usual, and
    /// BodyLength and CheckSum cover the data.
    #[test]
    fn data_fields_are_read_by_their_declared_length() {
        let raw: &[u8] = b"a\x0110=123\x01b";
        let xml: &[u8] = b"<x>\x01</x>";
        let enc: &[u8] = b"\x01\x01";
        let (raw_len, xml_len) = (raw.len().to_string(), xml.len().to_string());
        let f = framed(&[
            (95, raw_len.as_bytes()),
            (96, raw),
            (58, b"after"),
            (212, xml_len.as_bytes()),
            (213, xml),
            (354, b"2"),
            (355, enc),
            (11, b"42"),
        ]);
        assert_eq!(split_frame(&f), Ok(f.len()));
        let m = Message::parse(&f).unwrap();
        assert_eq!(m.get(96), Some(raw));
        assert_eq!(m.get(213), Some(xml));
        assert_eq!(m.get(355), Some(enc));
        assert_eq!(
            (m.get(58), m.get(11)),
            (Some(&b"after"[..]), Some(&b"42"[..]))
        );
        assert_eq!(m.get(10), None);
        let tags: Vec<u32> = m.fields().map(|f| f.unwrap().0).collect();
        assert_eq!(tags, [35, 49, 56, 34, 95, 96, 58, 212, 213, 354, 355, 11]);
        // Past the index (24 fields) too.
        let mut many: Vec<(u32, &[u8])> = vec![(5000, b"x"); 30];
        many.extend_from_slice(&[(95, raw_len.as_bytes()), (96, raw), (58, b"end")]);
        let f = framed(&many);
        let m = Message::parse(&f).unwrap();
        assert_eq!((m.get(96), m.get(58)), (Some(raw), Some(&b"end"[..])));
        // A data field without its length field before it is an ordinary field.
        let f = framed(&[(96, b"plain"), (58, b"t")]);
        assert_eq!(Message::parse(&f).unwrap().get(96), Some(&b"plain"[..]));
    }

    /// A declared length that runs past the message, stops short of a SOH, or is not a
    /// number makes the message garbled; never a panic.
    #[test]
    fn bad_data_lengths_are_garbled() {
        for (len, data) in [
            (&b"200"[..], &b"ab\x01cd"[..]),
            (b"18446744073709551615", b"ab"),
            (b"3", b"ab\x01cd"),
            (b"1", b"ab"),
            (b"x", b"ab"),
            (b"0", b"ab"),
        ] {
            let f = framed(&[(95, len), (96, data), (58, b"t")]);
            assert_eq!(split_frame(&f), Ok(f.len()));
            assert!(
                matches!(Message::parse(&f), Err(FixError::BadDataLength(_))),
                "95={} 96={:?}",
                String::from_utf8_lossy(len),
                data
            );
        }
        // Every truncation and every one-byte change of a frame with data parses or fails
        // without a panic.
        let f = framed(&[(95, b"5"), (96, b"a\x01b\x01c"), (58, b"t")]);
        for i in 0..f.len() {
            let _ = split_frame(&f[..i]);
            let mut g = f.clone();
            for b in [0u8, 1, b'=', b'9', 0xff] {
                g[i] = b;
                if split_frame(&g).is_ok() {
                    let _ = Message::parse(&g).map(|m| m.fields().count());
                }
            }
        }
    }

    #[test]
    fn prices() {
        let mut w = MessageWriter::default();
        w.start(b"D").price(44, 1_234_500).price(31, -5);
        let mut out = Vec::new();
        w.finish(&mut out);
        let m = Message::parse(&out).unwrap();
        assert_eq!(m.get(44), Some(&b"123.4500"[..]));
        assert_eq!(m.price(44), Ok(1_234_500));
        assert_eq!(m.price(31), Ok(-5));
        assert_eq!(parse_price(b"10"), Some(100_000));
        assert_eq!(parse_price(b"0.12345"), Some(1234));
        assert_eq!(parse_price(b"1.x"), None);
        assert_eq!(parse_price(b""), None);
    }

    #[test]
    fn timestamps() {
        let mut v = Vec::new();
        write_utc_timestamp(&mut v, 951_782_400_123_000_000); // 2000-02-29 00:00:00.123
        assert_eq!(v, b"20000229-00:00:00.123");
    }

    /// UTCTimestamps read back what `write_utc_timestamp` writes, with seconds only, or
    /// micro/nanoseconds; malformed or out-of-range ones are refused.
    #[test]
    fn timestamps_parse() {
        for t in [
            0,
            951_782_400_123_000_000,
            1_704_207_600_999_000_000,
            4_102_444_799_001_000_000,
        ] {
            let mut v = Vec::new();
            write_utc_timestamp(&mut v, t);
            assert_eq!(
                parse_utc_timestamp(&v),
                Some(t),
                "{}",
                String::from_utf8_lossy(&v)
            );
        }
        assert_eq!(
            parse_utc_timestamp(b"20000229-00:00:00"),
            Some(951_782_400_000_000_000)
        );
        assert_eq!(
            parse_utc_timestamp(b"20000229-00:00:00.123456789"),
            Some(951_782_400_123_456_789)
        );
        assert_eq!(
            parse_utc_timestamp(b"20000229-00:00:00.123456"),
            Some(951_782_400_123_456_000)
        );
        for bad in [
            &b""[..],
            b"20000229",
            b"20000229 00:00:00",
            b"20010229-00:00:00",
            b"20001301-00:00:00",
            b"20000229-24:00:00",
            b"20000229-00:60:00",
            b"20000229-00:00:61",
            b"20000229-00:00:00.1",
            b"20000229-00:00:00.",
            b"20000229-00:00:00.12a",
            b"2000022x-00:00:00",
            b"19691231-23:59:59",
            b"+0000229-00:00:00",
        ] {
            assert_eq!(
                parse_utc_timestamp(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
