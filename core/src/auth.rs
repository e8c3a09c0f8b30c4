//! Keyed authentication: one challenge-response for every handshake
//! (orders connections, engine logons, the market-data recovery port) and
//! a short tag for datagrams on fabrics that are not trusted.
//!
//! Free of I/O: the shells carry the nonces and tags in whatever bytes
//! their handshake has (rdma_cm private data, a first frame).
//!
//! # The scheme
//! Both sides hold a [`Key`] derived from the configured shared secret for
//! one purpose (keys for different purposes are unrelated, so a tag made
//! for one handshake is worthless in another).
//!
//! 1. The initiator proves first: with its hello it sends a fresh nonce
//!    `Ni` (8 bytes from the OS, then the wall-clock time it was made:
//!    [`Initiator::new_at`]) and `T0 = MAC(K, "initiator first", Ni,
//!    hello, cookie)` ([`Initiator::first_proof`]; `cookie` is empty unless
//!    the responder asked for one). The responder checks `T0`
//!    ([`check_first_proof`]) before it answers, allocates or counts
//!    anything: a peer that cannot make `T0` gets nothing keyed by the
//!    secret, and nothing that names the responder (WireGuard's "silent to
//!    anyone who has not proved").
//! 2. The responder answers with its own fresh nonce `Nr` and
//!    `Tr = MAC(K, "responder", Ni, Nr, ctx)`: proof that it knows the key,
//!    bound to this attempt.
//! 3. The initiator checks `Tr` and sends `Ti = MAC(K, "initiator", Ni, Nr,
//!    ctx)`; the responder checks it before it lets any traffic through.
//!
//! `ctx` is whatever both sides must agree on (the two hellos: ring
//! addresses, sizes), so a man in the middle cannot change it unnoticed.
//! Step 1 has nothing fresh from the responder in it, so a captured one
//! checks out again; it can never pass step 3 (the responder's `Nr` is new
//! every time), and a responder that must not even answer it (the orders
//! listener) refuses a first proof it answered before or one made too long
//! ago by the time in `Ni` ([`crate::admission::ReplayGuard`]). Tags are
//! compared in constant time.
//!
//! # Secrets, and what a capture reveals
//! Every key here is derived from a configured secret. Whoever captures a
//! full handshake holds `T0`, `Tr` and `Ti` over known inputs: each lets
//! them test a guess of the secret offline, as fast as BLAKE3 runs. No
//! scheme with a shared symmetric secret and no password-authenticated key
//! exchange can avoid that; what makes it useless is the secret's entropy:
//! [`check_secret`] refuses secrets of fewer than [`MIN_SECRET_BITS`] bits of
//! key material and the shipped sample values, and [`generate_secret`]
//! (`rocebus keygen`) makes one, so a guess succeeds with probability
//! 2^-128 (2^-256 for keygen's default). A stranger who only connects (no
//! capture) gets no tag at all: nothing to test a guess against, not even
//! one per connect request. A capture reveals no key, no session key (they
//! are derived, never sent), and nothing of one purpose's key that helps
//! with another's.
//!
//! What it does not do: encrypt. RoCE carries payloads in clear; anyone
//! who can read the fabric reads the orders. The handshake MAC is keyed
//! BLAKE3 truncated to 128 bits.
//!
//! # Datagram tags
//! A [`DatagramKey`] tags every market-data datagram on fabrics that are not
//! trusted: SipHash-2-4 (a keyed pseudorandom function designed for
//! authenticating short network messages) with a 128-bit key derived from
//! the secret, 64-bit tags. A forger's chance is 2^-64 per datagram, and
//! every failure is counted by the subscriber. SipHash runs 28 rounds of
//! scalar adds, rotates and xors over a 90-byte datagram (about 500
//! instructions); keyed BLAKE3, used before, ran two 64-byte SIMD
//! compressions for a tag and two for a check: about as many instructions,
//! but 5-7x the time on the host and 8-20x in the emulated guest
//! (`rocebus-bench tag-cost`), where it cost 11 us of md-latency's p50.

use std::fmt;

use subtle::ConstantTimeEq;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a handshake tag (BLAKE3 keyed hash truncated to 128 bits).
pub const TAG_LEN: usize = 16;
/// Bytes of a datagram tag (SipHash-2-4, 64 bits).
pub const DATAGRAM_TAG_LEN: usize = 8;

/// A handshake nonce.
pub type Nonce = [u8; NONCE_LEN];
/// An authentication tag.
pub type Tag = [u8; TAG_LEN];

/// What a key is for; part of its derivation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Orders connections (the ring handshake).
    Orders,
    /// Engine logons on the order gateway.
    EngineLogon,
    /// The market-data recovery and snapshot port.
    Recovery,
}

impl Purpose {
    fn context(self) -> &'static str {
        match self {
            Purpose::Orders => "rocebus 2026-12 orders admission",
            Purpose::EngineLogon => "rocebus 2026-12 engine logon",
            Purpose::Recovery => "rocebus 2026-12 recovery admission",
        }
    }
}

/// A 256-bit key for one [`Purpose`], derived from a shared secret.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// Derives the key for `purpose` from `secret` (BLAKE3 `derive_key`).
    pub fn derive(secret: &[u8], purpose: Purpose) -> Self {
        Key(blake3::derive_key(purpose.context(), secret))
    }

    /// The tag of `parts`, each length-prefixed so that no two different
    /// lists of parts hash alike.
    pub fn tag(&self, parts: &[&[u8]]) -> Tag {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        out
    }

    /// Whether `tag` is the tag of `parts`, compared in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        tag.len() == TAG_LEN && bool::from(self.tag(parts).ct_eq(tag))
    }

    /// A key for one session, derived from this key and both nonces (for
    /// binding later messages of the same connection to its handshake).
    pub fn session(&self, ni: &Nonce, nr: &Nonce) -> Key {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"session");
        h.update(ni);
        h.update(nr);
        Key(*h.finalize().as_bytes())
    }
}

/// The key of per-datagram tags: SipHash-2-4 keyed once, so a tag is one
/// pass over the datagram with no set-up.
#[derive(Clone)]
pub struct DatagramKey(siphasher::sip::SipHasher24);

impl fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatagramKey(..)")
    }
}

impl DatagramKey {
    /// Derives the 128-bit SipHash key from `secret` (BLAKE3 `derive_key`
    /// with a context of its own: unrelated to every handshake key).
    pub fn derive(secret: &[u8]) -> Self {
        let k = blake3::derive_key("rocebus 2026-12 datagram tag siphash-2-4", secret);
        let mut k16 = [0u8; 16];
        k16.copy_from_slice(&k[..16]);
        DatagramKey(siphasher::sip::SipHasher24::new_with_key(&k16))
    }

    /// The tag of `body` (SipHash covers the length: bodies of different
    /// lengths never share a computation).
    #[inline]
    pub fn tag(&self, body: &[u8]) -> [u8; DATAGRAM_TAG_LEN] {
        self.0.hash(body).to_le_bytes()
    }

    /// Whether `tag` is the tag of `body`, compared in constant time.
    #[inline]
    pub fn verify(&self, body: &[u8], tag: &[u8]) -> bool {
        tag.len() == DATAGRAM_TAG_LEN && bool::from(self.tag(body).ct_eq(tag))
    }
}

/// A fresh nonce from the operating system's generator.
pub fn nonce() -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    // getrandom fails only where the OS has no generator at all; a
    // handshake without one must not proceed with a guessable nonce.
    getrandom::getrandom(&mut n).expect("the OS random generator is unavailable");
    n
}

/// When an initiator's nonce says it was made (wall-clock nanoseconds
/// since the UNIX epoch; see [`Initiator::new_at`]). Only a first proof
/// that checked out makes it a time the initiator vouched for.
pub fn nonce_time(ni: &Nonce) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&ni[8..]);
    u64::from_le_bytes(t)
}

/// Why a handshake was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The peer's tag is not the one the key makes: it does not know the
    /// secret, or replays an old handshake, or the context was altered.
    #[error("the peer's proof of the shared secret is wrong")]
    BadProof,
}

const RESPONDER: &[u8] = b"responder";
const INITIATOR: &[u8] = b"initiator";
const INITIATOR_FIRST: &[u8] = b"initiator first";

/// Whether `proof` is the initiator's first proof ([`Initiator::first_proof`])
/// for nonce `ni`, `hello` and `cookie` (empty when none): what a responder
/// checks before it answers anything.
pub fn check_first_proof(key: &Key, ni: &Nonce, hello: &[u8], cookie: &[u8], proof: &[u8]) -> bool {
    key.verify(&[INITIATOR_FIRST, ni, hello, cookie], proof)
}

/// The initiator's side of the challenge-response.
#[derive(Debug)]
pub struct Initiator {
    key: Key,
    ni: Nonce,
}

impl Initiator {
    /// Starts a handshake now (the wall clock): send [`Initiator::nonce`]
    /// with the hello.
    pub fn new(key: Key) -> Self {
        Self::new_at(key, crate::clock::Wall::now())
    }

    /// Starts a handshake made at `made`: the nonce is 8 bytes from the OS
    /// generator, then `made` in nanoseconds since the UNIX epoch (little
    /// endian, [`nonce_time`]). The first proof covers both, so a responder
    /// can refuse a captured request once it is older than it accepts and
    /// only has to remember the nonces it answered inside that window
    /// ([`crate::admission::ReplayGuard`]). 64 random bits with the time
    /// never repeat in practice; the responder's nonce stays 128 random bits.
    pub fn new_at(key: Key, made: crate::clock::Wall) -> Self {
        let mut ni = nonce();
        ni[8..].copy_from_slice(&made.as_nanos().to_le_bytes());
        Initiator { key, ni }
    }

    /// The nonce to send.
    pub fn nonce(&self) -> Nonce {
        self.ni
    }

    /// The proof that goes with the hello, before the responder has said
    /// anything: over the nonce, the hello as sent and the responder's
    /// cookie (empty when none was asked for). See [`check_first_proof`].
    pub fn first_proof(&self, hello: &[u8], cookie: &[u8]) -> Tag {
        self.key.tag(&[INITIATOR_FIRST, &self.ni, hello, cookie])
    }

    /// Checks the responder's answer; on success returns the proof to send
    /// back and the session key.
    pub fn on_response(&self, nr: &Nonce, tr: &[u8], ctx: &[u8]) -> Result<(Tag, Key), AuthError> {
        if !self.key.verify(&[RESPONDER, &self.ni, nr, ctx], tr) {
            return Err(AuthError::BadProof);
        }
        let ti = self.key.tag(&[INITIATOR, &self.ni, nr, ctx]);
        Ok((ti, self.key.session(&self.ni, nr)))
    }
}

/// The responder's side of the challenge-response.
#[derive(Debug)]
pub struct Responder {
    key: Key,
    ni: Nonce,
    nr: Nonce,
}

impl Responder {
    /// Answers an initiator's nonce: send [`Responder::nonce`] and the
    /// returned tag.
    pub fn new(key: Key, ni: Nonce, ctx: &[u8]) -> (Self, Tag) {
        let nr = nonce();
        let tr = key.tag(&[RESPONDER, &ni, &nr, ctx]);
        (Responder { key, ni, nr }, tr)
    }

    /// The nonce to send.
    pub fn nonce(&self) -> Nonce {
        self.nr
    }

    /// Checks the initiator's proof; on success returns the session key.
    pub fn on_proof(&self, ti: &[u8], ctx: &[u8]) -> Result<Key, AuthError> {
        if !self.key.verify(&[INITIATOR, &self.ni, &self.nr, ctx], ti) {
            return Err(AuthError::BadProof);
        }
        Ok(self.key.session(&self.ni, &self.nr))
    }
}

/// Key material a configured secret or token must carry, in bits.
pub const MIN_SECRET_BITS: usize = 128;

/// Bits of key material `value` carries at most, read conservatively: hex
/// text 4 bits a character, base64 (standard or URL-safe, padding not
/// counted) 6, anything else 4 (a passphrase is not a key).
pub fn secret_bits(value: &str) -> usize {
    let b = value.as_bytes();
    if b.iter().all(u8::is_ascii_hexdigit) {
        4 * b.len()
    } else if b
        .iter()
        .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'-' | b'_' | b'='))
    {
        6 * b.iter().filter(|&&c| c != b'=').count()
    } else {
        4 * b.len()
    }
}

/// Parts of the sample values the shipped configs carry (`change-me`,
/// `demo-token`, ...): a config that still has one was never given a key.
const SAMPLE_SECRETS: [&str; 3] = ["change-me", "changeme", "demo-"];

/// Why a configured secret is refused ([`check_secret`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WeakSecret {
    /// Fewer than [`MIN_SECRET_BITS`] bits of key material.
    #[error("has at most {bits} bits of key material, fewer than {MIN_SECRET_BITS}: use a random key, e.g. the output of `rocebus keygen` (`rocebus keygen --bits 128` where at most 32 bytes fit)")]
    TooShort {
        /// What [`secret_bits`] counted.
        bits: usize,
    },
    /// A sample value of the shipped configs.
    #[error("is a sample value of the shipped configs: replace it with a random key, e.g. the output of `rocebus keygen`")]
    Sample,
}

/// Checks a configured secret or token: at least [`MIN_SECRET_BITS`] of key
/// material and none of the shipped sample values. Handshakes and tags are
/// only as strong as the secret: anyone who saw one handshake can test
/// guesses offline, so a secret must be a random key, not a word.
pub fn check_secret(value: &str) -> Result<(), WeakSecret> {
    let lower = value.to_ascii_lowercase();
    if SAMPLE_SECRETS.iter().any(|s| lower.contains(s)) {
        return Err(WeakSecret::Sample);
    }
    let bits = secret_bits(value);
    if bits < MIN_SECRET_BITS {
        return Err(WeakSecret::TooShort { bits });
    }
    Ok(())
}

/// A random key of `bits` bits (a multiple of 8) from the OS generator, as
/// lowercase hex: what `rocebus keygen` prints.
pub fn generate_secret(bits: usize) -> String {
    let mut k = vec![0u8; bits / 8];
    // As for nonces: no key from a generator that is not there.
    getrandom::getrandom(&mut k).expect("the OS random generator is unavailable");
    k.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(a: &[u8], b: &[u8]) -> (Key, Key) {
        (
            Key::derive(a, Purpose::Orders),
            Key::derive(b, Purpose::Orders),
        )
    }

    #[test]
    fn a_handshake_with_the_same_secret_succeeds_both_ways() {
        let (ki, kr) = pair(b"s3cret", b"s3cret");
        let ini = Initiator::new(ki);
        let (resp, tr) = Responder::new(kr, ini.nonce(), b"ctx");
        let (ti, si) = ini.on_response(&resp.nonce(), &tr, b"ctx").unwrap();
        let sr = resp.on_proof(&ti, b"ctx").unwrap();
        assert_eq!(si.0, sr.0);
    }

    #[test]
    fn the_first_proof_binds_key_nonce_hello_and_cookie() {
        let (ki, kr) = pair(b"s3cret", b"s3cret");
        let ini = Initiator::new(ki);
        let t0 = ini.first_proof(b"hello", b"");
        let ni = ini.nonce();
        assert!(check_first_proof(&kr, &ni, b"hello", b"", &t0));
        assert!(!check_first_proof(&kr, &ni, b"hellp", b"", &t0));
        assert!(!check_first_proof(&kr, &[0; NONCE_LEN], b"hello", b"", &t0));
        assert!(!check_first_proof(&kr, &ni, b"hello", b"cookie", &t0));
        assert!(!check_first_proof(
            &Key::derive(b"s3cres", Purpose::Orders),
            &ni,
            b"hello",
            b"",
            &t0
        ));
        let tc = ini.first_proof(b"hello", b"cookie");
        assert!(check_first_proof(&kr, &ni, b"hello", b"cookie", &tc));
        // Unrelated to the later proofs: one is never the other.
        let (resp, tr) = Responder::new(kr, ni, b"hello");
        assert_ne!(t0, tr);
        let (ti, _) = ini.on_response(&resp.nonce(), &tr, b"hello").unwrap();
        assert_ne!(t0, ti);
    }

    #[test]
    fn an_initiator_nonce_carries_its_time_and_random_bytes() {
        let made = crate::clock::Wall::from_nanos(1_765_000_000_123_456_789);
        let a = Initiator::new_at(Key::derive(b"s", Purpose::Orders), made);
        let b = Initiator::new_at(Key::derive(b"s", Purpose::Orders), made);
        assert_eq!(nonce_time(&a.nonce()), made.as_nanos());
        assert_ne!(a.nonce(), b.nonce(), "random first half");
        let now = crate::clock::Wall::now().as_nanos();
        let t = nonce_time(&Initiator::new(Key::derive(b"s", Purpose::Orders)).nonce());
        assert!(t >= now && t - now < 60_000_000_000, "{t} vs {now}");
    }

    #[test]
    fn a_wrong_secret_fails_on_either_side() {
        let (ki, kr) = pair(b"s3cret", b"s3cres");
        let ini = Initiator::new(ki.clone());
        let (resp, tr) = Responder::new(kr, ini.nonce(), b"ctx");
        assert_eq!(
            ini.on_response(&resp.nonce(), &tr, b"ctx").unwrap_err(),
            AuthError::BadProof
        );
        // An initiator that forges a proof with its own (wrong) key.
        let forged = ki.tag(&[INITIATOR, &ini.nonce(), &resp.nonce(), b"ctx"]);
        assert_eq!(
            resp.on_proof(&forged, b"ctx").unwrap_err(),
            AuthError::BadProof
        );
    }

    #[test]
    fn a_replayed_proof_fails_against_a_new_responder_nonce() {
        let (ki, kr) = pair(b"s3cret", b"s3cret");
        let ini = Initiator::new(ki);
        let (resp, tr) = Responder::new(kr.clone(), ini.nonce(), b"ctx");
        let (ti, _) = ini.on_response(&resp.nonce(), &tr, b"ctx").unwrap();
        // The attacker replays the initiator's nonce and proof.
        let (resp2, _) = Responder::new(kr, ini.nonce(), b"ctx");
        assert_ne!(resp.nonce(), resp2.nonce());
        assert_eq!(
            resp2.on_proof(&ti, b"ctx").unwrap_err(),
            AuthError::BadProof
        );
    }

    #[test]
    fn an_altered_context_fails() {
        let (ki, kr) = pair(b"s3cret", b"s3cret");
        let ini = Initiator::new(ki);
        let (resp, tr) = Responder::new(kr, ini.nonce(), b"ring 4096");
        assert!(ini.on_response(&resp.nonce(), &tr, b"ring 2^31").is_err());
    }

    #[test]
    fn keys_for_different_purposes_are_unrelated() {
        let a = Key::derive(b"s", Purpose::Orders);
        let b = Key::derive(b"s", Purpose::Recovery);
        assert_ne!(a.tag(&[b"x"]), b.tag(&[b"x"]));
        // Length prefixes: ["ab","c"] and ["a","bc"] differ.
        assert_ne!(a.tag(&[b"ab", b"c"]), a.tag(&[b"a", b"bc"]));
        assert!(a.verify(&[b"x"], &a.tag(&[b"x"])));
        assert!(!a.verify(&[b"x"], &[0u8; 15]));
        assert_eq!(format!("{a:?}"), "Key(..)");
    }

    #[test]
    fn weak_and_sample_secrets_are_refused() {
        for weak in [
            "",
            "s3cret",
            "test-token",
            "0123456789abcdef0123456789abcde",
        ] {
            assert!(
                matches!(check_secret(weak), Err(WeakSecret::TooShort { .. })),
                "{weak}"
            );
        }
        for sample in ["change-me", "change-me-engine-1", "CHANGEME", "demo-token"] {
            assert_eq!(check_secret(sample), Err(WeakSecret::Sample), "{sample}");
        }
        // 32 hex characters, 22 base64 characters: 128 bits and more.
        assert_eq!(check_secret("0123456789abcdef0123456789abcdef"), Ok(()));
        assert_eq!(check_secret("AAECAwQFBgcICQoLDA0ODw"), Ok(()));
        assert_eq!(secret_bits("AAECAwQFBgcICQoLDA0ODw=="), 132);
        // A long passphrase counts 4 bits a character.
        assert!(check_secret("correct horse battery staple").is_err());
        let msg = check_secret("s3cret").unwrap_err().to_string();
        assert!(msg.contains("rocebus keygen"), "{msg}");
    }

    #[test]
    fn generated_secrets_pass_and_differ() {
        let a = generate_secret(256);
        assert_eq!(a.len(), 64);
        assert_eq!(check_secret(&a), Ok(()));
        assert_eq!(generate_secret(128).len(), 32);
        assert_eq!(check_secret(&generate_secret(128)), Ok(()));
        assert_ne!(a, generate_secret(256));
    }

    /// SipHash-2-4 as its authors define it: the reference test vector for
    /// key 00..0f and message 00..0e (15 bytes), `a129ca6149be45e5` read as
    /// little-endian bytes.
    #[test]
    fn datagram_tags_are_siphash_2_4() {
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let k = DatagramKey(siphasher::sip::SipHasher24::new_with_key(&key));
        let msg: Vec<u8> = (0..15u8).collect();
        assert_eq!(
            k.tag(&msg),
            [0xe5, 0x45, 0xbe, 0x49, 0x61, 0xca, 0x29, 0xa1]
        );
    }

    #[test]
    fn datagram_tags_check_body_length_and_key() {
        let k = DatagramKey::derive(b"s");
        let body = [7u8; 90];
        let t = k.tag(&body);
        assert!(k.verify(&body, &t));
        assert!(!k.verify(&body[..89], &t));
        assert!(!k.verify(&body, &t[..7]));
        let mut bad = t;
        bad[0] ^= 1;
        assert!(!k.verify(&body, &bad));
        assert!(!DatagramKey::derive(b"t").verify(&body, &t));
        // A handshake key from the same secret tags differently.
        let hk = Key::derive(b"s", Purpose::Recovery).tag(&[&body]);
        assert_ne!(&hk[..DATAGRAM_TAG_LEN], &t[..]);
        assert_eq!(format!("{k:?}"), "DatagramKey(..)");
    }

    /// The tag's definition is on the wire (datagram tags, handshakes): any change to how
    /// it is computed, however it is optimised, must leave these bytes alone.
    #[test]
    fn tags_are_pinned_to_their_wire_definition() {
        let k = DatagramKey::derive(b"pinned secret");
        let body: Vec<u8> = (0..100u8).collect();
        assert_eq!(k.tag(&body), PINNED_DATAGRAM);
        let k = Key::derive(b"pinned secret", Purpose::Orders);
        assert_eq!(
            k.tag(&[RESPONDER, &[1; NONCE_LEN], &[2; NONCE_LEN], b"ctx"]),
            PINNED_HANDSHAKE
        );
    }

    const PINNED_DATAGRAM: [u8; DATAGRAM_TAG_LEN] = [82, 209, 220, 252, 139, 207, 92, 8];
    const PINNED_HANDSHAKE: Tag = [
        109, 167, 136, 195, 2, 39, 79, 147, 245, 157, 21, 207, 252, 236, 25, 16,
    ];
}
