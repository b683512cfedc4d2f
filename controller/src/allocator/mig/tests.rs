use super::*;

/// An H100's profiles as `nvidia-smi mig -lgipp` lists them (docs/mig.md): name, slices,
/// starts, instances at most. Written out here, apart from the agent's table.
const H100: &[(&str, u32, &[u32], usize)] = &[
    ("7g.80gb", 8, &[0], 1),
    ("4g.40gb", 4, &[0], 1),
    ("3g.40gb", 4, &[0, 4], 2),
    ("2g.20gb", 2, &[0, 2, 4], 3),
    ("1g.20gb", 2, &[0, 2, 4, 6], 4),
    ("1g.10gb", 1, &[0, 1, 2, 3, 4, 5, 6], 7),
    ("1g.10gb+me", 1, &[0, 1, 2, 3, 4, 5, 6], 1),
];

/// A node's reconfigurable H100s as their agent would report them: the instances each holds.
#[derive(Debug, Clone, Default)]
struct Node {
    gpus: Vec<Vec<(&'static str, u32, u32)>>,
}

impl Node {
    fn new(gpus: usize) -> Self {
        Self {
            gpus: vec![Vec::new(); gpus],
        }
    }

    fn overlaps(held: &[(&str, u32, u32)], start: u32, size: u32) -> bool {
        held.iter()
            .any(|&(_, s, z)| start < s + z && s < start + size)
    }

    fn layouts(&self) -> Vec<MigGpuLayout> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, held)| MigGpuLayout {
                gpu_uuid: format!("GPU-{i}"),
                gpu_index: u32::try_from(i).unwrap(),
                slices: 8,
                occupied: held.iter().map(|&(_, s, z)| (s, z)).collect(),
                profiles: H100
                    .iter()
                    .map(|&(name, size, starts, max)| MigProfilePlacements {
                        profile: name.to_owned(),
                        size,
                        starts: starts.to_vec(),
                        free: starts
                            .iter()
                            .copied()
                            .filter(|&s| !Self::overlaps(held, s, size))
                            .filter(|_| held.iter().filter(|h| h.0 == name).count() < max)
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Holds the placement, checking it as the driver would: a start of the profile, no slice
    /// held twice.
    fn hold(&mut self, p: &MigPlacement) {
        let (name, size, starts, _) = *H100.iter().find(|h| h.0 == p.profile).unwrap();
        assert!(starts.contains(&p.start) && size == p.size, "{p:?}");
        let held = &mut self.gpus[p.gpu_index as usize];
        assert!(
            !Self::overlaps(held, p.start, p.size),
            "{p:?} overlaps {held:?}"
        );
        held.push((name, p.start, p.size));
    }

    /// First fit, the naive choice: the lowest GPU, then its lowest free start.
    fn first_fit(&self, profile: &str) -> Option<MigPlacement> {
        self.layouts().into_iter().find_map(|l| {
            let p = l.profiles.iter().find(|p| p.profile == profile)?;
            Some(MigPlacement {
                gpu_uuid: l.gpu_uuid.clone(),
                gpu_index: l.gpu_index,
                profile: profile.to_owned(),
                start: *p.free.first()?,
                size: p.size,
            })
        })
    }

    /// Places each request in turn with `choose`; how many were placed.
    fn run(
        &mut self,
        requests: &[&str],
        choose: impl Fn(&Self, &str) -> Option<MigPlacement>,
    ) -> usize {
        let mut placed = 0;
        for r in requests {
            if let Some(p) = choose(self, r) {
                self.hold(&p);
                placed += 1;
            }
        }
        placed
    }
}

fn rule(node: &Node, profile: &str) -> Option<MigPlacement> {
    choose_placement(&node.layouts(), profile)
}

#[test]
fn a_first_small_instance_leaves_room_for_the_4g() {
    let node = Node::new(1);
    let p = rule(&node, "1g.10gb").unwrap();
    assert_eq!((p.gpu_index, p.start, p.size), (0, 6, 1));
    // First fit takes slice 0, the 4g's only start.
    assert_eq!(node.first_fit("1g.10gb").unwrap().start, 0);
}

#[test]
fn requests_that_first_fit_fragments_all_fit_under_the_rule() {
    // One GPU: a 1g, a 2g, then the 4g.
    let requests = ["1g.10gb", "2g.20gb", "4g.40gb"];
    let mut naive = Node::new(1);
    assert_eq!(naive.run(&requests, Node::first_fit), 2);
    let mut chosen = Node::new(1);
    assert_eq!(chosen.run(&requests, rule), 3);
    // Two GPUs: a 1g, a 4g, then a whole 7g. First fit spreads the first two over both GPUs.
    let requests = ["1g.10gb", "4g.40gb", "7g.80gb"];
    let mut naive = Node::new(2);
    assert_eq!(naive.run(&requests, Node::first_fit), 2);
    let mut chosen = Node::new(2);
    assert_eq!(chosen.run(&requests, rule), 3);
    assert_eq!(chosen.gpus[0].len(), 2, "{:?}", chosen.gpus);
    assert_eq!(chosen.gpus[1], [("7g.80gb", 0, 8)]);
    // Seven 1g fill a GPU under both (the rule only orders them).
    let mut chosen = Node::new(1);
    assert_eq!(chosen.run(&["1g.10gb"; 8], rule), 7);
}

#[test]
fn the_rule_prefers_the_gpu_already_cut() {
    // GPU 1 holds an operator's 3g at 4; GPU 0 is whole: a 2g goes to GPU 1, keeping the 7g.
    let mut node = Node::new(2);
    node.gpus[1].push(("3g.40gb", 4, 4));
    let p = rule(&node, "2g.20gb").unwrap();
    assert_eq!(p.gpu_index, 1);
    // With nothing free for a profile anywhere: none.
    node.gpus[0].push(("7g.80gb", 0, 8));
    node.gpus[1].push(("4g.40gb", 0, 4));
    assert_eq!(rule(&node, "1g.10gb"), None);
}

#[test]
fn no_slice_is_handed_out_twice() {
    // Many sequences of requests and releases on three GPUs; `hold` checks each placement as
    // the driver would, and after each the node holds no slice twice.
    let names: Vec<&str> = H100.iter().map(|h| h.0).collect();
    let mut seed = 0x2545_f491_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        usize::try_from(seed % n as u64).unwrap()
    };
    let mut placed = 0;
    for _ in 0..200 {
        let mut node = Node::new(3);
        for _ in 0..20 {
            if next(4) == 0 {
                let g = next(3);
                if !node.gpus[g].is_empty() {
                    let i = next(node.gpus[g].len());
                    node.gpus[g].remove(i);
                }
                continue;
            }
            if let Some(p) = rule(&node, names[next(names.len())]) {
                node.hold(&p);
                placed += 1;
            }
        }
        for held in &node.gpus {
            let mask = held.iter().fold(0u64, |m, &(_, s, z)| {
                let bits = ((1u64 << z) - 1) << s;
                assert_eq!(m & bits, 0, "{held:?}");
                m | bits
            });
            assert!(mask <= 0xff);
        }
    }
    assert!(placed > 1000, "{placed}");
}

#[test]
fn a_start_reported_free_that_overlaps_is_not_taken() {
    let mut node = Node::new(1);
    node.gpus[0].push(("1g.10gb", 6, 1));
    let mut layouts = node.layouts();
    // An agent that wrongly calls 6 free for 1g.20gb (slices 6-7).
    let p = layouts[0]
        .profiles
        .iter_mut()
        .find(|p| p.profile == "1g.20gb")
        .unwrap();
    p.free = vec![6];
    assert_eq!(choose_placement(&layouts, "1g.20gb"), None);
}
