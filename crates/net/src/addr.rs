//! Which addresses are "restricted": anything not plainly on the public
//! internet. The broker refuses to connect to these unless the policy names
//! them (an IP or CIDR rule) or sets `allow_private`.
//!
//! The IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible,
//! the NAT64 well-known prefix, 6to4) are judged by the IPv4 address inside,
//! so `::ffff:127.0.0.1` is as restricted as `127.0.0.1`. Everything outside
//! IPv6 global unicast (`2000::/3`) is restricted, as are the IETF
//! protocol assignments inside it.
//!
//! The documentation and benchmarking ranges (`192.0.2.0/24`,
//! `198.51.100.0/24`, `203.0.113.0/24`, `198.18.0.0/15`, `2001:db8::/32`) are
//! *not* restricted: they hold no host-local or internal service, and some
//! networks do route to them on purpose (resolvers that answer with "fake"
//! addresses for a local proxy, test farms whose registry mirror sits there).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address in its canonical form: an IPv4-mapped IPv6 address becomes
/// the IPv4 address it maps, so rules and checks see one spelling.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// True when `ip` is not a public unicast address (see the module docs).
pub fn is_restricted(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_restricted(v4),
        IpAddr::V6(v6) => v6_restricted(v6),
    }
}

fn v4_restricted(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    let in_net = |net: [u8; 4], len: u32| -> bool {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        (u32::from_be_bytes(o) & mask) == (u32::from_be_bytes(net) & mask)
    };
    in_net([0, 0, 0, 0], 8) // "this network", unspecified
        || in_net([10, 0, 0, 0], 8)
        || in_net([100, 64, 0, 0], 10) // CGNAT (and some clouds' metadata)
        || in_net([127, 0, 0, 0], 8)
        || in_net([169, 254, 0, 0], 16) // link-local, cloud metadata
        || in_net([172, 16, 0, 0], 12)
        || in_net([192, 0, 0, 0], 24) // IETF protocol assignments
        || in_net([192, 88, 99, 0], 24) // 6to4 relay anycast
        || in_net([192, 168, 0, 0], 16)
        || in_net([224, 0, 0, 0], 4) // multicast
        || in_net([240, 0, 0, 0], 4) // reserved, broadcast
}

fn v6_restricted(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded_v4 = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (which
    // includes :: and ::1, both restricted as 0.0.0.0 and 0.0.0.1 are).
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return v4_restricted(embedded_v4(s[6], s[7]));
    }
    // NAT64 well-known prefix 64:ff9b::/96.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_restricted(embedded_v4(s[6], s[7]));
    }
    // 6to4 2002:a.b.c.d::/48.
    if s[0] == 0x2002 {
        return v4_restricted(embedded_v4(s[1], s[2]));
    }
    // Only global unicast 2000::/3 is public; that excludes ULA fc00::/7,
    // link-local fe80::/10, multicast ff00::/8, 64:ff9b:1::/48, 100::/64.
    if s[0] & 0xe000 != 0x2000 {
        return true;
    }
    // Inside 2000::/3: IETF protocol assignments 2001::/23 (Teredo, which
    // hides an IPv4 address, among them).
    s[0] == 0x2001 && s[1] < 0x0200
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> bool {
        is_restricted(s.parse().unwrap())
    }

    #[test]
    fn restricted_v4() {
        for a in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "100.100.100.200",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(r(a), "{a}");
        }
        for a in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
        ] {
            assert!(!r(a), "{a}");
        }
    }

    #[test]
    fn restricted_v6() {
        for a in [
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "2001::1",
        ] {
            assert!(r(a), "{a}");
        }
        for a in [
            "2606:4700::1111",
            "2a00:1450::1",
            "::ffff:1.1.1.1",
            "64:ff9b::101:101",
        ] {
            assert!(!r(a), "{a}");
        }
    }

    #[test]
    fn canonical_unmaps() {
        assert_eq!(
            canonical("::ffff:1.2.3.4".parse().unwrap()),
            "1.2.3.4".parse::<IpAddr>().unwrap()
        );
    }
}
