//! The switch-facing QoS state of a NIC port as the read-only tools print it: which
//! priorities have PFC (priority flow control) on, whether the port classifies by DSCP
//! (`trust dscp`) or by the VLAN PCP, and the DSCP → priority map. `mlnx_qos -i IF`
//! (Mellanox/NVIDIA's tool) and iproute2's `dcb pfc show` / `dcb app show` are parsed;
//! neither is required.

/// The QoS state of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Qos {
    /// Which tool said so (`mlnx_qos`, `dcb`).
    pub source: &'static str,
    /// Priorities (0-7) with PFC on.
    pub pfc: Vec<u8>,
    /// `dscp` or `pcp`, when the tool says.
    pub trust: Option<String>,
    /// Explicit DSCP → priority entries (DSCP values not listed use the default, DSCP >> 3).
    pub dscp_prio: Vec<(u8, u8)>,
}

impl Qos {
    /// The priority a packet with `dscp` lands in when the port trusts DSCP.
    pub fn priority_of(&self, dscp: u8) -> u8 {
        self.dscp_prio
            .iter()
            .find(|(d, _)| *d == dscp)
            .map_or(dscp >> 3, |(_, p)| *p)
    }
}

/// Parses `mlnx_qos -i IF`; `None` if no PFC table is in the text.
pub fn parse_mlnx_qos(text: &str) -> Option<Qos> {
    let mut q = Qos {
        source: "mlnx_qos",
        ..Qos::default()
    };
    let mut in_pfc = false;
    let mut saw_pfc = false;
    for line in text.lines() {
        let l = line.trim();
        if let Some(t) = l.strip_prefix("Priority trust state:") {
            q.trust = Some(t.trim().to_owned());
        } else if let Some(rest) = l.strip_prefix("prio:") {
            // `prio:3 dscp:31,30,29,28,27,26,25,24,`
            let mut it = rest.split_whitespace();
            let prio: Option<u8> = it.next().and_then(|p| p.parse().ok());
            let dscps = it.next().and_then(|d| d.strip_prefix("dscp:"));
            if let (Some(p), Some(d)) = (prio, dscps) {
                for v in d.split(',').filter_map(|v| v.trim().parse::<u8>().ok()) {
                    q.dscp_prio.push((v, p));
                }
            }
        } else if l.starts_with("PFC configuration") {
            in_pfc = true;
        } else if in_pfc {
            if let Some(rest) = l.strip_prefix("enabled") {
                saw_pfc = true;
                q.pfc = rest
                    .split_whitespace()
                    .enumerate()
                    .filter(|(_, v)| *v == "1")
                    .filter_map(|(i, _)| u8::try_from(i).ok())
                    .collect();
                in_pfc = false;
            }
        }
    }
    saw_pfc.then_some(q)
}

/// Parses `dcb pfc show dev IF` (`prio-pfc 0:off 1:off 2:off 3:on ...`) and, if given,
/// `dcb app show dev IF dscp-prio` (`dscp-prio 24:3 26:3`); `None` without a `prio-pfc`.
pub fn parse_dcb(pfc: &str, app: Option<&str>) -> Option<Qos> {
    let mut q = Qos {
        source: "dcb",
        ..Qos::default()
    };
    let mut saw = false;
    for w in pfc.split_whitespace() {
        if w == "prio-pfc" {
            saw = true;
        } else if let Some((p, state)) = w.split_once(':') {
            if let (Ok(p), "on") = (p.parse::<u8>(), state) {
                q.pfc.push(p);
            }
        }
    }
    if let Some(app) = app {
        for w in app.split_whitespace() {
            if let Some((d, p)) = w.split_once(':') {
                if let (Ok(d), Ok(p)) = (d.parse::<u8>(), p.parse::<u8>()) {
                    q.dscp_prio.push((d, p));
                }
            }
        }
        if !q.dscp_prio.is_empty() {
            // An APP table with DSCP entries is how dcb sets DSCP trust.
            q.trust = Some("dscp".to_owned());
        }
    }
    saw.then_some(q)
}
