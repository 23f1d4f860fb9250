//! Makes a test CA and a server certificate it signed for 127.0.0.1 and localhost:
//! `test-certs DIR NAME` writes DIR/NAME-ca.pem, DIR/NAME-cert.pem (the chain) and
//! DIR/NAME-key.pem, and prints their paths, one per line. For the Python tests of TLS.

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(name)) = (args.next(), args.next()) else {
        eprintln!("usage: test-certs DIR NAME");
        std::process::exit(2);
    };
    let certs = tests::certs::make(std::path::Path::new(&dir), &name);
    for p in [certs.ca, certs.cert, certs.key] {
        println!("{}", p.display());
    }
}
