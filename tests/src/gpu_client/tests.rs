use super::*;

#[test]
fn reads_reply_values() {
    let reply = "ok handle=0xcaf00001 size=2097152";
    assert_eq!(reply_value(reply, "handle"), Some(0xcaf0_0001));
    assert_eq!(reply_value(reply, "size"), Some(2 << 20));
    assert_eq!(reply_value("err status=0x51", "status"), Some(0x51));
    assert_eq!(reply_value("ok", "size"), None);
    assert_eq!(reply_value("ok sizes=3", "size"), None);
}

#[test]
fn raw_ioctls_refuse_buffers_smaller_than_the_command() {
    let err = ioctl_raw(0, ioctl_cmd(esc::RM_ALLOC, 48), &mut [0u8; 32]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn dup_takes_over_and_close_falls_back() {
    let scratch = gpuwarden_test_support::scratch("client");
    let dir = scratch.path();
    for name in ["nvidiactl", "nvidia-uvm", "nvidia0"] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let mut c = GpuClient::open(dir).unwrap();
    let ctl = c.ctl_fd().unwrap();
    let copy = c.dup(ctl).unwrap();
    assert_ne!(copy, ctl);
    assert_eq!(c.ctl_fd(), Some(copy), "RM calls go through the copy");
    c.close(copy).unwrap();
    assert_eq!(c.ctl_fd(), Some(ctl));
    c.close(ctl).unwrap();
    assert_eq!(c.ctl_fd(), None);
    assert!(matches!(c.close(ctl), Err(ClientError::NotOpen { .. })));
    // With the control fd gone, RM calls fail the way they would in a real process.
    match c.alloc_client() {
        Err(RmError::Ioctl { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EBADF));
        }
        other => panic!("{other:?}"),
    }
    // On a regular file, an NVIDIA ioctl is just an unknown ioctl.
    let gpu = c.gpu_fd(0).unwrap();
    let err = ioctl_raw(gpu, ioctl_cmd(esc::RM_ALLOC, 32), &mut [0u8; 32]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTTY));
}
