use std::cell::RefCell;

use super::*;
use crate::fake_driver::caller::Fault;

struct Buffer(RefCell<Vec<u8>>);

impl CallerMemory for Buffer {
    fn fd_path(&self, _fd: u64) -> Option<std::path::PathBuf> {
        None
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, Fault> {
        let a = usize::try_from(addr).map_err(|_| Fault)?;
        self.0
            .borrow()
            .get(a..a + len)
            .map(<[u8]>::to_vec)
            .ok_or(Fault)
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let a = usize::try_from(addr).map_err(|_| Fault)?;
        self.0
            .borrow_mut()
            .get_mut(a..a + data.len())
            .ok_or(Fault)?
            .copy_from_slice(data);
        Ok(())
    }
}

#[test]
fn writes_rm_status_where_the_layout_is_known() {
    let mem = Buffer(RefCell::new(vec![0xff; 64]));
    assert_eq!(
        answer(uvm::INITIALIZE, &mem, || Some(0)),
        Ok("uvm_initialize")
    );
    assert_eq!(&mem.0.borrow()[8..12], &[0, 0, 0, 0]);
    assert_eq!(mem.0.borrow()[12], 0xff, "nothing past rmStatus");
    assert_eq!(
        answer(uvm::CREATE_EXTERNAL_RANGE, &mem, || Some(32)),
        Ok("uvm_create_external_range")
    );
    assert_eq!(&mem.0.borrow()[48..52], &[0, 0, 0, 0]);
}

#[test]
fn other_commands_touch_nothing() {
    let mem = Buffer(RefCell::new(vec![0xff; 16]));
    let never = || -> Option<u64> { panic!("no argument needed") };
    assert_eq!(
        answer(uvm::MAP_EXTERNAL_ALLOCATION, &mem, never),
        Ok("uvm_map_external_allocation")
    );
    assert_eq!(
        answer(uvm::DEINITIALIZE, &mem, never),
        Ok("uvm_deinitialize")
    );
    assert!(mem.0.borrow().iter().all(|&b| b == 0xff));
    assert_eq!(answer(9999, &mem, never), Err(libc::EINVAL));
    assert_eq!(answer(uvm::INITIALIZE, &mem, || None), Err(libc::EFAULT));
    assert_eq!(
        answer(uvm::INITIALIZE, &mem, || Some(1 << 20)),
        Err(libc::EFAULT)
    );
}
