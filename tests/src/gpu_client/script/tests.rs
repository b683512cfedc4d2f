use super::*;

fn alloc(bytes: u64, form: Form, layout: ParamsLayout, via: Via) -> Command {
    Command::Alloc {
        client: 0xc1d0_0001,
        parent: 0xcaf0_0001,
        bytes,
        form,
        layout,
        via,
    }
}

#[test]
fn parses_rm_commands() {
    use ParamsLayout::{V120, V128};
    assert_eq!(parse("client"), Ok(Command::Client));
    assert_eq!(
        parse("  device 0xc1d00001 1 \n"),
        Ok(Command::Device {
            client: 0xc1d0_0001,
            id: 1
        })
    );
    assert_eq!(
        parse("alloc 0xc1d00001 0xcaf00001 64m"),
        Ok(alloc(64 << 20, Form::Nvos21, V128, Via::Direct))
    );
    assert_eq!(
        parse("alloc 0xc1d00001 0xcaf00001 3m nvos64 v120 xfer"),
        Ok(alloc(3 << 20, Form::Nvos64, V120, Via::Xfer))
    );
    assert_eq!(
        parse("alloc 0xc1d00001 0xcaf00001 4096 xfer nvos64"),
        Ok(alloc(4096, Form::Nvos64, V128, Via::Xfer))
    );
    assert_eq!(
        parse("free 1 2 3"),
        Ok(Command::Free {
            client: 1,
            parent: 2,
            handle: 3,
            via: Via::Direct
        })
    );
    assert_eq!(
        parse("free 1 2 3 xfer"),
        Ok(Command::Free {
            client: 1,
            parent: 2,
            handle: 3,
            via: Via::Xfer
        })
    );
    assert_eq!(
        parse("control 1 2 0x20800122"),
        Ok(Command::Control {
            client: 1,
            object: 2,
            cmd: 0x2080_0122
        })
    );
    assert_eq!(
        parse("virtual 1 2 1g"),
        Ok(Command::Virtual {
            client: 1,
            parent: 2,
            bytes: 1 << 30
        })
    );
}

#[test]
fn parses_uvm_and_fd_commands() {
    assert_eq!(parse("uvm init"), Ok(Command::Uvm(UvmCommand::Init)));
    assert_eq!(parse("uvm 73"), Ok(Command::Uvm(UvmCommand::Raw(73))));
    assert_eq!(
        parse("uvm range 0x7f0000000000 2m"),
        Ok(Command::Uvm(UvmCommand::Range {
            base: 0x7f00_0000_0000,
            length: 2 << 20
        }))
    );
    assert_eq!(
        parse("uvm free 0x1000"),
        Ok(Command::Uvm(UvmCommand::Free {
            base: 0x1000,
            length: 0
        }))
    );
    assert_eq!(parse("dup"), Ok(Command::Dup { fd: FdRef::Ctl }));
    assert_eq!(parse("dup uvm"), Ok(Command::Dup { fd: FdRef::Uvm }));
    assert_eq!(
        parse("close 7"),
        Ok(Command::Close {
            fd: FdRef::Number(7)
        })
    );
    assert_eq!(
        parse("ioctl-raw /dev/null 0xc020462b"),
        Ok(Command::IoctlRaw {
            target: Target::Path("/dev/null".into()),
            cmd: 0xc020_462b
        })
    );
    assert_eq!(
        parse("ioctl-raw ctl 0xc018462b"),
        Ok(Command::IoctlRaw {
            target: Target::Fd(FdRef::Ctl),
            cmd: 0xc018_462b
        })
    );
    assert_eq!(
        parse("open nvidia1"),
        Ok(Command::Open {
            path: "nvidia1".into(),
            how: OpenHow::Openat,
        })
    );
    assert_eq!(
        parse("open nvidiactl uring"),
        Ok(Command::Open {
            path: "nvidiactl".into(),
            how: OpenHow::Uring,
        })
    );
    assert!(parse("open nvidiactl sideways").is_err());
    assert_eq!(parse("getfd 42 3"), Ok(Command::GetFd { pid: 42, fd: 3 }));
    assert_eq!(
        parse("dup-many ctl 10"),
        Ok(Command::DupMany {
            fd: FdRef::Ctl,
            count: 10
        })
    );
}

#[test]
fn parses_process_commands() {
    assert_eq!(
        parse("thread free 1 2 3"),
        Ok(Command::Thread(Box::new(Command::Free {
            client: 1,
            parent: 2,
            handle: 3,
            via: Via::Direct
        })))
    );
    assert_eq!(
        parse("thread fork"),
        Err(ParseError::NotNested {
            command: "fork",
            within: "thread"
        })
    );
    assert_eq!(parse("fork"), Ok(Command::Fork));
    assert_eq!(
        parse("child alloc 1 2   3m"),
        Ok(Command::Child("alloc 1 2 3m".into()))
    );
    assert_eq!(parse("child exit"), Ok(Command::WaitChild));
    assert_eq!(parse("wait-child"), Ok(Command::WaitChild));
    assert_eq!(parse("kill-child"), Ok(Command::KillChild));
    assert_eq!(parse("sleep 250"), Ok(Command::Sleep { ms: 250 }));
    assert_eq!(parse("exit"), Ok(Command::Exit));
}

#[test]
fn reports_what_is_wrong() {
    assert_eq!(parse(" "), Err(ParseError::Empty));
    assert_eq!(
        parse("frobnicate 1"),
        Err(ParseError::UnknownCommand {
            word: "frobnicate".into()
        })
    );
    assert_eq!(
        parse("alloc 1 2"),
        Err(ParseError::Missing {
            command: "alloc",
            what: "size"
        })
    );
    assert_eq!(
        parse("alloc 1 2 3x"),
        Err(ParseError::Number(NumberError::NotANumber {
            word: "3x".into()
        }))
    );
    assert_eq!(
        parse("alloc 1 2 3 nvos99"),
        Err(ParseError::Unexpected {
            command: "alloc",
            word: "nvos99".into()
        })
    );
    assert_eq!(
        parse("device 1 2 3"),
        Err(ParseError::Unexpected {
            command: "device",
            word: "3".into()
        })
    );
    assert_eq!(
        parse("uvm init now"),
        Err(ParseError::Unexpected {
            command: "uvm",
            word: "now".into()
        })
    );
    assert!(matches!(
        parse("child bogus"),
        Err(ParseError::UnknownCommand { .. })
    ));
    assert!(matches!(
        parse("device 0x100000000 0"),
        Err(ParseError::Number(_))
    ));
    // Errors read well in an `err` reply.
    assert_eq!(
        parse("alloc 1").unwrap_err().to_string(),
        "alloc: missing parent"
    );
}

#[test]
fn parses_the_other_allocation_paths() {
    assert_eq!(
        parse("allocmem 0x1 0x2 0xd0 4m osdesc"),
        Ok(Command::AllocMemory {
            client: 1,
            parent: 2,
            handle: 0xd0,
            bytes: 4 << 20,
            class: MemoryClass::OsDescriptor,
        })
    );
    assert!(matches!(
        parse("allocmem 1 2 3 4k"),
        Ok(Command::AllocMemory {
            class: MemoryClass::System,
            ..
        })
    ));
    assert!(parse("allocmem 1 2 3 4k video").is_err());
    assert_eq!(
        parse("vidheap 1 2 3m sysmem"),
        Ok(Command::VidHeap {
            client: 1,
            parent: 2,
            bytes: 3 << 20,
            kind: HeapKind::System,
        })
    );
    assert!(parse("vidheap 1 2").is_err());
    assert_eq!(
        parse("vidheap-free 1 2 3"),
        Ok(Command::VidHeapFree {
            client: 1,
            parent: 2,
            handle: 3,
        })
    );
    assert!(parse("vidheap-free 1 2 3 4").is_err());
}

#[test]
fn parses_the_fd_table_commands() {
    assert_eq!(
        parse("close-range 3 4294967295"),
        Ok(Command::CloseRange {
            first: 3,
            last: u32::MAX,
        })
    );
    assert_eq!(
        parse("use-ctl 7"),
        Ok(Command::UseCtl {
            fd: FdRef::Number(7),
        })
    );
    assert_eq!(
        parse("dup-to ctl 1500"),
        Ok(Command::DupTo {
            fd: FdRef::Ctl,
            min: 1500,
        })
    );
    assert!(parse("dup-to ctl").is_err());
    assert!(parse("close-range 3").is_err());
    assert!(parse("use-ctl 7 8").is_err());
}
