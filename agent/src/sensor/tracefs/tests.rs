use super::*;

const FORK_6_18: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
";

const EXIT_5_15: &str = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
";

#[test]
fn reads_offsets_from_format_files() {
    assert_eq!(field_offset(FORK_6_18, "parent_pid"), Some(12));
    assert_eq!(field_offset(FORK_6_18, "child_pid"), Some(20));
    assert_eq!(field_offset(FORK_6_18, "parent_comm"), Some(8));
    assert_eq!(field_offset(EXIT_5_15, "comm"), Some(8));
    assert_eq!(field_offset(EXIT_5_15, "pid"), Some(24));
    assert_eq!(field_offset(EXIT_5_15, "group_dead"), None);
}

#[test]
fn missing_group_dead_is_marked_absent() {
    let scratch = gpuwarden_test_support::scratch("tracefs");
    let dir = scratch.path();
    let exit = dir.join("events/sched/sched_process_exit");
    std::fs::create_dir_all(&exit).unwrap();
    std::fs::write(exit.join("format"), EXIT_5_15).unwrap();
    let config = config_offsets(dir);
    assert_eq!(config.exit_group_dead, FIELD_ABSENT);
    assert_eq!(config.exit_pid, 24);
    // No fork format: the defaults stay.
    assert_eq!(config.fork_child_pid, Config::DEFAULT.fork_child_pid);
}
