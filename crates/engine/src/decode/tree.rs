//! Draft-tree topologies.
//!
//! A [`DraftTree`] is one flat list of nodes in level order (topologically sorted: every
//! parent comes before its children, and depths never decrease), each with the index of its
//! parent. Node 0 is the root: the last token already accepted, whose target distribution
//! verifies the first level of drafts. Everything a decoding step needs is derived once from
//! the parent indices: depths, position ids, the additive ancestor attention bias, the children
//! of each node (a node with `k` children draws `k` drafts with the chosen construction), the
//! levels (one batched draft forward each) and the root-to-leaf paths.
//!
//! Topologies come from presets (`chain-K`, `drafts-N-depth-D`, EAGLE's `mc_sim_7b_63`), from
//! EAGLE's path-list format (`[[0],[1],[0,0],...]`: each path lists child ranks from the
//! root), or from a TOML file with either `preset = "..."` or `paths = [[0], [0, 0], ...]`.

use std::ops::Range;
use std::path::Path;

pub use crate::error::TreeError;

/// Largest number of draft nodes accepted (a guard against typos such as `drafts-50-depth-9`).
pub const MAX_NODES: usize = 4096;

/// EAGLE's default sparse tree (`mc_sim_7b_63`): 25 draft nodes, depth 5, 4 at the first level.
pub const MC_SIM_7B_63: &[&[usize]] = &[
    &[0],
    &[1],
    &[2],
    &[3],
    &[0, 0],
    &[0, 1],
    &[0, 2],
    &[1, 0],
    &[1, 1],
    &[2, 0],
    &[2, 1],
    &[3, 0],
    &[0, 0, 0],
    &[0, 0, 1],
    &[0, 0, 2],
    &[0, 1, 0],
    &[0, 1, 1],
    &[0, 2, 0],
    &[0, 2, 1],
    &[1, 0, 0],
    &[0, 0, 0, 0],
    &[0, 0, 0, 1],
    &[0, 0, 0, 2],
    &[0, 0, 0, 0, 0],
    &[0, 0, 0, 0, 1],
];

/// A draft-tree topology (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    /// `parents[i]` for node `i >= 1`; `parents[0]` is `usize::MAX` (the root).
    parents: Vec<usize>,
    depths: Vec<usize>,
    /// Child-rank path of every node from the root (empty for the root).
    paths: Vec<Vec<usize>>,
    children: Vec<Vec<usize>>,
    levels: Vec<Range<usize>>,
}

impl DraftTree {
    /// Builds a tree from EAGLE-style child-rank paths, in any order.
    pub fn from_paths(paths: &[Vec<usize>]) -> Result<Self, TreeError> {
        if paths.is_empty() {
            return Err(TreeError::Empty);
        }
        if paths.len() > MAX_NODES {
            return Err(TreeError::TooLarge { nodes: paths.len(), limit: MAX_NODES });
        }
        let mut sorted: Vec<Vec<usize>> = paths.to_vec();
        for p in &sorted {
            if p.is_empty() {
                return Err(TreeError::EmptyPath(p.clone()));
            }
        }
        // Level order: by depth, then lexicographically (parents' order, then rank).
        sorted.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(TreeError::Duplicate { path: w[0].clone() });
        }
        let mut all = vec![Vec::new()];
        all.extend(sorted);
        let index_of = |path: &[usize], all: &[Vec<usize>]| {
            all.binary_search_by(|p| p.len().cmp(&path.len()).then_with(|| p.as_slice().cmp(path))).ok()
        };
        let n = all.len();
        let mut parents = vec![usize::MAX; n];
        let mut depths = vec![0; n];
        let mut children = vec![Vec::new(); n];
        for i in 1..n {
            let path = &all[i];
            let prefix = &path[..path.len() - 1];
            let parent = index_of(prefix, &all)
                .ok_or_else(|| TreeError::MissingParent { path: path.clone(), missing: prefix.to_vec() })?;
            parents[i] = parent;
            depths[i] = path.len();
            children[parent].push(i);
        }
        for (node, kids) in children.iter().enumerate() {
            let ranks: Vec<usize> = kids.iter().map(|&k| *all[k].last().expect("non-root")).collect();
            if ranks.iter().enumerate().any(|(r, &rank)| r != rank) {
                return Err(TreeError::RankGap { parent: all[node].clone(), ranks });
            }
        }
        let max_depth = *depths.iter().max().expect("non-empty");
        let levels = (0..=max_depth)
            .map(|d| {
                let start = depths.partition_point(|&x| x < d);
                let end = depths.partition_point(|&x| x <= d);
                start..end
            })
            .collect();
        Ok(Self { parents, depths, paths: all, children, levels })
    }

    /// The tree of the root alone: no drafts (one target row per step, plain decoding).
    pub fn root_only() -> Self {
        Self {
            parents: vec![usize::MAX],
            depths: vec![0],
            paths: vec![Vec::new()],
            children: vec![Vec::new()],
            levels: std::iter::once(0..1).collect(),
        }
    }

    /// A preset by name: `chain-D`, `chain-D-forks-K` (a chain of depth D whose first K nodes,
    /// the root included, also draw a second draft, a leaf), `drafts-N-depth-D` (a full tree,
    /// N drafts per node) or `mc_sim_7b_63`.
    pub fn preset(name: &str) -> Result<Self, TreeError> {
        let unknown = || TreeError::UnknownPreset(name.to_string());
        if name == "mc_sim_7b_63" {
            let paths: Vec<Vec<usize>> = MC_SIM_7B_63.iter().map(|p| p.to_vec()).collect();
            return Self::from_paths(&paths);
        }
        if let Some((d, k)) = name.strip_prefix("chain-").and_then(|rest| rest.split_once("-forks-")) {
            let (d, k): (usize, usize) = (d.parse().map_err(|_| unknown())?, k.parse().map_err(|_| unknown())?);
            if d == 0 || k == 0 || k > d {
                return Err(unknown());
            }
            // Refused before the paths are built (`from_paths` would refuse them after).
            if d.saturating_add(k) > MAX_NODES {
                return Err(TreeError::TooLarge { nodes: d.saturating_add(k), limit: MAX_NODES });
            }
            let chain = (1..=d).map(|i| vec![0; i]);
            let forks = (0..k).map(|i| {
                let mut p = vec![0; i];
                p.push(1);
                p
            });
            return Self::from_paths(&chain.chain(forks).collect::<Vec<_>>());
        }
        if let Some(k) = name.strip_prefix("chain-") {
            let k: usize = k.parse().map_err(|_| unknown())?;
            if k == 0 {
                return Err(unknown());
            }
            return Self::full(1, k);
        }
        if let Some(rest) = name.strip_prefix("drafts-") {
            let (n, d) = rest.split_once("-depth-").ok_or_else(unknown)?;
            let (n, d): (usize, usize) = (n.parse().map_err(|_| unknown())?, d.parse().map_err(|_| unknown())?);
            if n == 0 || d == 0 {
                return Err(unknown());
            }
            return Self::full(n, d);
        }
        Err(unknown())
    }

    /// The full tree with `n` children per node and depth `d`.
    fn full(n: usize, d: usize) -> Result<Self, TreeError> {
        let mut nodes: usize = 0;
        let mut level: usize = 1;
        for _ in 0..d {
            level = level.saturating_mul(n);
            nodes = nodes.saturating_add(level);
            if nodes > MAX_NODES {
                return Err(TreeError::TooLarge { nodes, limit: MAX_NODES });
            }
        }
        let mut paths: Vec<Vec<usize>> = Vec::with_capacity(nodes);
        let mut frontier: Vec<Vec<usize>> = vec![Vec::new()];
        for _ in 0..d {
            let mut next = Vec::with_capacity(frontier.len() * n);
            for p in &frontier {
                for r in 0..n {
                    let mut c = p.clone();
                    c.push(r);
                    next.push(c);
                }
            }
            paths.extend(next.iter().cloned());
            frontier = next;
        }
        Self::from_paths(&paths)
    }

    /// Parses EAGLE's path-list text, e.g. `[[0],[1],[0,0]]`.
    pub fn from_path_list(text: &str) -> Result<Self, TreeError> {
        Self::from_path_list_in(text, "<path list>")
    }

    /// [`Self::from_path_list`], naming `file` in its errors.
    fn from_path_list_in(text: &str, file: &str) -> Result<Self, TreeError> {
        let malformed = |reason: String| TreeError::Malformed { file: file.into(), reason };
        let value: toml::Value = toml::from_str(&format!("paths = {text}")).map_err(|e| malformed(e.to_string()))?;
        Self::from_paths(&paths_of(&value["paths"]).map_err(malformed)?)
    }

    /// A preset name, an inline path list (`[[0],[1],[0,0]]`), or a file holding a TOML table
    /// with `preset = "..."` or `paths = [[...], ...]`, or a bare path list (as EAGLE's
    /// `choices.py` writes them, or as JSON).
    pub fn load(spec: &str) -> Result<Self, TreeError> {
        if spec.trim_start().starts_with('[') {
            return Self::from_path_list(spec);
        }
        let path = Path::new(spec);
        if !path.exists() && !spec.ends_with(".toml") {
            return Self::preset(spec);
        }
        let file = spec.to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| TreeError::File { file: file.clone(), reason: e.to_string() })?;
        // A topology error names the file.
        let in_file = |e: TreeError| match e {
            TreeError::Malformed { .. } => e,
            e => TreeError::Malformed { file: file.clone(), reason: e.to_string() },
        };
        if text.trim_start().starts_with('[') {
            return Self::from_path_list_in(&text, &file).map_err(in_file);
        }
        let malformed = |reason: String| TreeError::Malformed { file: file.clone(), reason };
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| malformed(e.to_string()))?;
        match (table.get("preset"), table.get("paths")) {
            (Some(toml::Value::String(name)), None) => Self::preset(name),
            (None, Some(paths)) => Self::from_paths(&paths_of(paths).map_err(malformed)?).map_err(in_file),
            (Some(_), Some(_)) => Err(malformed("give either `preset` or `paths`, not both".into())),
            (Some(_), None) => Err(malformed("`preset` must be a string".into())),
            (None, None) => Err(malformed("expected `preset = \"...\"` or `paths = [[0], [0, 0], ...]`".into())),
        }
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Number of draft nodes (the root excluded).
    pub fn num_drafts(&self) -> usize {
        self.len() - 1
    }

    /// Always false: a tree holds at least one draft node.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The parent of node `i >= 1`.
    pub fn parent(&self, i: usize) -> Option<usize> {
        (i > 0).then(|| self.parents[i])
    }

    pub fn depth(&self, i: usize) -> usize {
        self.depths[i]
    }

    /// The deepest level (the longest chain of drafts).
    pub fn max_depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The children of node `i` (drafts drawn from `q` at `i`), in rank order.
    pub fn children(&self, i: usize) -> &[usize] {
        &self.children[i]
    }

    /// Whether some node has more than one child (else the tree is a chain).
    pub fn branches(&self) -> bool {
        self.children.iter().any(|c| c.len() > 1)
    }

    /// Node indices of each depth (level 0 is the root alone).
    pub fn levels(&self) -> &[Range<usize>] {
        &self.levels
    }

    /// The child-rank path of node `i` from the root.
    pub fn path(&self, i: usize) -> &[usize] {
        &self.paths[i]
    }

    /// Node indices from the root to `i`, both included.
    pub fn node_path(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.depths[i] + 1);
        let mut a = i;
        while a != usize::MAX {
            out.push(a);
            a = self.parents[a];
        }
        out.reverse();
        out
    }

    /// Position ids of the nodes when the root sits at position `root_position`.
    pub fn position_ids(&self, root_position: usize) -> Vec<usize> {
        self.depths.iter().map(|d| root_position + d).collect()
    }

    /// Whether `j` is `i` or one of its ancestors.
    pub fn is_ancestor_or_self(&self, j: usize, mut i: usize) -> bool {
        while i != usize::MAX && self.depths[i] >= self.depths[j] {
            if i == j {
                return true;
            }
            i = self.parents[i];
        }
        false
    }

    /// The additive attention bias among the tree's nodes, row-major `len x len`: 0 where the
    /// column node is the row node or one of its ancestors, `-inf` elsewhere.
    pub fn attention_bias(&self) -> Vec<f32> {
        let n = self.len();
        let mut bias = vec![f32::NEG_INFINITY; n * n];
        for i in 0..n {
            let mut a = i;
            while a != usize::MAX {
                bias[i * n + a] = 0.0;
                a = self.parents[a];
            }
        }
        bias
    }

    /// Node indices of every root-to-leaf path (the root included).
    pub fn leaf_paths(&self) -> Vec<Vec<usize>> {
        (0..self.len())
            .filter(|&i| self.children[i].is_empty())
            .map(|leaf| {
                let mut path = vec![leaf];
                let mut a = leaf;
                while let Some(p) = self.parent(a) {
                    path.push(p);
                    a = p;
                }
                path.reverse();
                path
            })
            .collect()
    }
}

fn paths_of(value: &toml::Value) -> Result<Vec<Vec<usize>>, String> {
    let list = value.as_array().ok_or("`paths` must be a list of lists of child ranks")?;
    list.iter()
        .map(|p| {
            p.as_array()
                .ok_or_else(|| format!("tree path {p} is not a list"))?
                .iter()
                .map(|r| match r.as_integer() {
                    Some(r) if r >= 0 => Ok(r as usize),
                    _ => Err(format!("tree path {p} has {r}, not a child rank (an integer >= 0)")),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_documented_shapes() {
        let t = DraftTree::preset("mc_sim_7b_63").unwrap();
        assert_eq!((t.num_drafts(), t.max_depth(), t.children(0).len()), (25, 5, 4));
        let chain = DraftTree::preset("chain-4").unwrap();
        assert_eq!((chain.num_drafts(), chain.max_depth()), (4, 4));
        assert!((0..4).all(|i| chain.children(i) == [i + 1]));
        let full = DraftTree::preset("drafts-2-depth-4").unwrap();
        assert_eq!((full.num_drafts(), full.max_depth()), (2 + 4 + 8 + 16, 4));
        assert!(full.levels().iter().enumerate().all(|(d, r)| r.len() == 1 << d));
        assert_eq!(DraftTree::preset("drafts-4-depth-3").unwrap().num_drafts(), 4 + 16 + 64);
        // A chain of 3 with a second draft at the root and at depth 1.
        let forked = DraftTree::preset("chain-3-forks-2").unwrap();
        let want = DraftTree::from_path_list("[[0], [1], [0, 0], [0, 1], [0, 0, 0]]").unwrap();
        assert_eq!(forked, want);
        assert_eq!((forked.num_drafts(), forked.max_depth()), (5, 3));
        assert_eq!(DraftTree::preset("chain-2-forks-1").unwrap().num_drafts(), 3);
        // Every chain node but the last has 2 children when K = D (what spechub needs).
        let all = DraftTree::preset("chain-4-forks-4").unwrap();
        assert!((0..all.len()).all(|i| [0, 2].contains(&all.children(i).len())));
        let e = DraftTree::preset("chain-99999999999-forks-1").unwrap_err();
        assert!(matches!(e, TreeError::TooLarge { .. }), "{e}");
        for bad in ["chain-2-forks-3", "chain-2-forks-0", "chain-0-forks-0", "chain-x-forks-1", "chain-2-forks-"] {
            let e = DraftTree::preset(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("chain-D-forks-K"), "{e}");
        }
    }

    #[test]
    fn derived_structure_is_consistent() {
        for name in ["mc_sim_7b_63", "chain-3", "drafts-3-depth-3"] {
            let t = DraftTree::preset(name).unwrap();
            let n = t.len();
            let bias = t.attention_bias();
            let pos = t.position_ids(100);
            for i in 0..n {
                assert_eq!(pos[i], 100 + t.depth(i));
                assert_eq!(t.path(i).len(), t.depth(i));
                if let Some(p) = t.parent(i) {
                    assert!(p < i, "topological order");
                    assert_eq!(t.depth(p) + 1, t.depth(i));
                    assert_eq!(&t.path(i)[..t.depth(p)], t.path(p));
                    assert!(t.children(p).contains(&i));
                }
                for j in 0..n {
                    // Ancestor-or-self by walking the path prefixes.
                    let anc = t.path(i).starts_with(t.path(j));
                    assert_eq!(bias[i * n + j] == 0.0, anc, "{name}: bias[{i}][{j}]");
                    assert_eq!(t.is_ancestor_or_self(j, i), anc);
                    if bias[i * n + j] != 0.0 {
                        assert_eq!(bias[i * n + j], f32::NEG_INFINITY);
                    }
                }
            }
            let leaves = t.leaf_paths();
            assert!(leaves.iter().all(|p| p[0] == 0 && t.children(*p.last().unwrap()).is_empty()));
            assert_eq!(leaves.len(), (0..n).filter(|&i| t.children(i).is_empty()).count());
        }
    }

    #[test]
    fn path_lists_and_files_load() {
        let t = DraftTree::from_path_list("[[0],[1],[0,0],[0,1],[1,0]]").unwrap();
        assert_eq!(t.num_drafts(), 5);
        assert_eq!(t.children(0).len(), 2);
        // Any input order gives the same tree.
        assert_eq!(DraftTree::from_path_list("[[1,0],[0,1],[0],[0,0],[1]]").unwrap(), t);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.toml");
        std::fs::write(&f, "paths = [[0], [1], [0, 0]]\n").unwrap();
        assert_eq!(DraftTree::load(f.to_str().unwrap()).unwrap().num_drafts(), 3);
        std::fs::write(&f, "preset = \"chain-2\"\n").unwrap();
        assert_eq!(DraftTree::load(f.to_str().unwrap()).unwrap(), DraftTree::preset("chain-2").unwrap());
        assert_eq!(DraftTree::load("drafts-2-depth-2").unwrap().num_drafts(), 6);
        // Inline, and a bare list in a file (JSON, or EAGLE's lists with newlines and a
        // trailing comma).
        assert_eq!(DraftTree::load(" [[0],[1],[0,0],[0,1],[1,0]]").unwrap(), t);
        let list = dir.path().join("t.json");
        std::fs::write(&list, "[[0], [1],\n [0, 0], [0, 1],\n [1, 0],\n]\n").unwrap();
        assert_eq!(DraftTree::load(list.to_str().unwrap()).unwrap(), t);
        std::fs::write(&list, "[[0], [0, 0, 0]]").unwrap();
        let e = DraftTree::load(list.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("t.json") && e.contains("prefix [0, 0] is not in the tree"), "{e}");
        assert!(DraftTree::load("[[0],[2]]").unwrap_err().to_string().contains("ranks [0, 2]"));
    }

    #[test]
    fn malformed_topologies_are_refused_clearly() {
        let err = |text: &str| DraftTree::from_path_list(text).unwrap_err().to_string();
        assert!(err("[[0],[0,0,0]]").contains("prefix [0, 0] is not in the tree"));
        assert!(err("[[0],[2]]").contains("ranks [0, 2]"));
        assert!(err("[[0],[0]]").contains("appears twice"));
        assert!(err("[[]]").contains("is empty"));
        assert!(err("[]").contains("no draft nodes"));
        assert!(err("[[0],[-1]]").contains("not a child rank"));
        assert!(err("[[0],[x]]").contains("malformed"));
        let e = DraftTree::preset("drafts-50-depth-9").unwrap_err().to_string();
        assert!(e.contains("larger than the limit"), "{e}");
        assert!(DraftTree::preset("chain-0").unwrap_err().to_string().contains("unknown tree preset `chain-0`"));
        assert!(DraftTree::preset("bushy").is_err());
        let e = DraftTree::load("/nonexistent/tree.toml").unwrap_err().to_string();
        assert!(e.contains("cannot read tree file /nonexistent/tree.toml"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, "paths = [[0], [0, 0]\n").unwrap();
        let e = DraftTree::load(f.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("malformed tree file") && e.contains("bad.toml"), "{e}");
        std::fs::write(&f, "nodes = 3\n").unwrap();
        assert!(DraftTree::load(f.to_str().unwrap()).unwrap_err().to_string().contains("expected `preset"));
    }

    #[test]
    fn shipped_tree_files_load() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/trees");
        let mut loaded = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let t = DraftTree::load(path.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
                assert!(t.num_drafts() > 0);
                loaded += 1;
            }
        }
        assert!(loaded >= 2, "found {loaded} tree files in {dir}");
    }
}
