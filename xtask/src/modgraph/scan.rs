//! Reads a crate's module tree with `syn`: which modules there are, what each defines, and every
//! path it names (`use` trees and paths in code), still relative to the module that names it.
//!
//! Test code is left out (a `#[cfg(test)]` item or module, a `tests`/`*_tests` module): tests may
//! reach anywhere. Macro bodies are token trees, not paths, and are not read.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::{
    Attribute, Item, ItemUse, UseTree, Visibility,
    visit::{self, Visit},
};

/// A module's place in its crate: the names after `crate::` (empty for the crate root).
pub type ModPath = Vec<String>;

/// One module as read from its file.
#[derive(Debug, Default)]
pub struct Module {
    /// The file it is in (an inline module shares its parent's).
    pub file: PathBuf,
    /// The modules it declares (test modules left out).
    pub children: BTreeSet<String>,
    /// The names of the items it defines itself (types, functions, traits, constants, macros).
    pub items: BTreeSet<String>,
    /// Names its `use`s bring in, to the path (as written, relative to this module) they stand for.
    pub aliases: BTreeMap<String, Vec<String>>,
    /// The paths of its glob imports (`use x::*`), as written.
    pub globs: Vec<Vec<String>>,
    /// Every path it names with two or more segments, as written, where it is written.
    pub refs: Vec<Ref>,
}

/// A path named in a module's code or `use` items.
#[derive(Debug, Clone)]
pub struct Ref {
    /// The path's segments as written (`super::x::Y` is `["super", "x", "Y"]`).
    pub segments: Vec<String>,
    /// The line it is on (1-based).
    pub line: usize,
}

/// Every module of a crate, by path.
#[derive(Debug, Default)]
pub struct Crate {
    /// The modules, the root (`[]`) included.
    pub modules: BTreeMap<ModPath, Module>,
}

/// What can go wrong reading a crate.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A module's file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is not Rust syn can parse.
    #[error("cannot parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        #[source]
        source: syn::Error,
    },
    /// A `mod x;` names no file.
    #[error("{parent}: module `{name}` has neither {name}.rs nor {name}/mod.rs")]
    Missing {
        /// The file that declares it.
        parent: PathBuf,
        /// The module's name.
        name: String,
    },
}

/// Reads the crate whose root file is `root` (`src/lib.rs`, `src/main.rs`), through `read` (the
/// file system, or a map in tests).
pub fn read_crate(
    root: &Path,
    read: &mut dyn FnMut(&Path) -> std::io::Result<String>,
) -> Result<Crate, ScanError> {
    let mut krate = Crate::default();
    let dir = root.parent().unwrap_or(Path::new("")).to_owned();
    let mut reader = Reader {
        read,
        krate: &mut krate,
    };
    reader.file(&Vec::new(), root, &dir)?;
    Ok(krate)
}

struct Reader<'a> {
    read: &'a mut dyn FnMut(&Path) -> std::io::Result<String>,
    krate: &'a mut Crate,
}

impl Reader<'_> {
    /// Reads the module `path` from `file`; its `mod x;` children are looked for in `dir`.
    fn file(&mut self, path: &ModPath, file: &Path, dir: &Path) -> Result<(), ScanError> {
        let text = (self.read)(file).map_err(|source| ScanError::Read {
            path: file.to_owned(),
            source,
        })?;
        self.text(path, file, &text, dir)
    }

    /// [`Reader::file`] with the file's `text` already read.
    fn text(
        &mut self,
        path: &ModPath,
        file: &Path,
        text: &str,
        dir: &Path,
    ) -> Result<(), ScanError> {
        let parsed = syn::parse_file(text).map_err(|source| ScanError::Parse {
            path: file.to_owned(),
            source,
        })?;
        self.module(path, file, dir, &parsed.items)
    }

    fn module(
        &mut self,
        path: &ModPath,
        file: &Path,
        dir: &Path,
        items: &[Item],
    ) -> Result<(), ScanError> {
        let mut module = Module {
            file: file.to_owned(),
            ..Module::default()
        };
        let mut collector = Collector {
            module: &mut module,
        };
        for item in items {
            if is_test(item_attrs(item)) {
                continue;
            }
            collector.visit_item(item);
        }
        let mut nested = Vec::new();
        for item in items {
            let Item::Mod(m) = item else { continue };
            let name = m.ident.to_string();
            if is_test(&m.attrs) || name == "tests" || name.ends_with("_tests") {
                continue;
            }
            module.children.insert(name.clone());
            nested.push((name, m));
        }
        self.krate.modules.insert(path.clone(), module);
        for (name, m) in nested {
            let mut child = path.clone();
            child.push(name.clone());
            let child_dir = dir.join(&name);
            if let Some((_, inline)) = &m.content {
                self.module(&child, file, &child_dir, inline)?;
                continue;
            }
            // `x.rs` first, else `x/mod.rs`.
            let flat = dir.join(format!("{name}.rs"));
            if let Ok(text) = (self.read)(&flat) {
                self.text(&child, &flat, &text, &child_dir)?;
                continue;
            }
            let nested_mod = child_dir.join("mod.rs");
            if (self.read)(&nested_mod).is_err() {
                return Err(ScanError::Missing {
                    parent: file.to_owned(),
                    name,
                });
            }
            self.file(&child, &nested_mod, &child_dir)?;
        }
        Ok(())
    }
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && matches!(&attr.meta, syn::Meta::List(list) if list.tokens.to_string().trim() == "test")
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Collects one module's items, imports and paths (not those of its inline child modules).
struct Collector<'a> {
    module: &'a mut Module,
}

impl Collector<'_> {
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) => self.use_leaf(prefix, &n.ident, &n.ident),
            UseTree::Rename(r) => self.use_leaf(prefix, &r.ident, &r.rename),
            UseTree::Glob(g) => {
                self.module.globs.push(prefix.clone());
                self.module.refs.push(Ref {
                    segments: prefix.clone(),
                    line: g.star_token.spans[0].start().line,
                });
            }
            UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }

    /// `prefix::ident as name` (`ident` is `self` for `prefix::{self}`).
    fn use_leaf(&mut self, prefix: &[String], ident: &syn::Ident, name: &syn::Ident) {
        let mut segments = prefix.to_vec();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let alias = if name == "self" {
            segments.last().cloned()
        } else {
            Some(name.to_string())
        };
        if let Some(alias) = alias.filter(|a| a != "_") {
            self.module.aliases.insert(alias, segments.clone());
        }
        self.module.refs.push(Ref {
            segments,
            line: ident.span().start().line,
        });
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        if is_test(item_attrs(item)) {
            return;
        }
        let name = match item {
            Item::Const(i) => Some(&i.ident),
            Item::Enum(i) => Some(&i.ident),
            Item::Fn(i) => Some(&i.sig.ident),
            Item::Static(i) => Some(&i.ident),
            Item::Struct(i) => Some(&i.ident),
            Item::Trait(i) => Some(&i.ident),
            Item::TraitAlias(i) => Some(&i.ident),
            Item::Type(i) => Some(&i.ident),
            Item::Union(i) => Some(&i.ident),
            Item::Macro(i) => i.ident.as_ref(),
            _ => None,
        };
        if let Some(name) = name {
            self.module.items.insert(name.to_string());
        }
        visit::visit_item(self, item);
    }

    /// Inline modules are modules of their own, read by [`Reader::module`].
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item_use(&mut self, item: &'ast ItemUse) {
        // `use ::x` names another crate.
        if item.leading_colon.is_none() {
            self.use_tree(&item.tree, &mut Vec::new());
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() >= 2 {
            self.module.refs.push(Ref {
                segments: path.segments.iter().map(|s| s.ident.to_string()).collect(),
                line: path.segments[0].ident.span().start().line,
            });
        }
        visit::visit_path(self, path);
    }

    /// `pub(in crate::x)` says who may look, not what is used.
    fn visit_visibility(&mut self, _: &'ast Visibility) {}

    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            visit::visit_impl_item_fn(self, f);
        }
    }
}
