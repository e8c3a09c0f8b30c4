//! What the C API's tests share.

/// The address of this host's RDMA device (in the guest: the runner's
/// `ROCEBUS_GUEST_ADDR`).
pub fn local_ip() -> std::net::IpAddr {
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return a;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let i = ctx.default_gid_index(1).expect("a GID");
    std::net::IpAddr::V4(
        ctx.query_gid(1, i)
            .expect("GID")
            .ipv4()
            .expect("an IPv4 GID"),
    )
}
