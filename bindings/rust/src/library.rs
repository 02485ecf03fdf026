// SPDX-License-Identifier: Apache-2.0
//! Loading libflashdecode with `dlopen` and checking that it is the ABI this crate speaks.
//!
//! This module does not depend on `handle`: handles are made from a library,
//! so `handle` depends on `library` (and defines [`Library::create_handle`]).

use std::ffi::{CStr, CString, OsStr};
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys;

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

// libdl: part of libc since glibc 2.34, a separate library before.
#[link(name = "dl")]
extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
    fn dlerror() -> *mut c_char;
    fn dladdr(address: *const c_void, info: *mut DlInfo) -> c_int;
}

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

/// A loaded libflashdecode: cheap to clone, unloaded when the last clone
/// and the last [`Handle`](crate::Handle) made from it are dropped.
///
/// It is `Send` and `Sync`: the header allows its version and status
/// functions from any thread, and handles carry their own thread rules.
#[derive(Clone)]
pub struct Library {
    inner: Arc<Loaded>,
}

struct Loaded {
    dl: *mut c_void,
    functions: sys::Functions,
    path: PathBuf,
    version: String,
    version_number: u32,
}

// The dlopen handle is process-global and immutable once loaded.
unsafe impl Send for Loaded {}
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: `dl` came from dlopen and every handle keeps this alive.
        unsafe { dlclose(self.dl) };
    }
}

impl Library {
    /// The environment variable naming the library file for [`Library::load`].
    pub const ENV: &'static str = "FLASHDECODE_LIBRARY";
    /// The SONAME [`Library::load`] asks the dynamic loader for.
    pub const SONAME: &'static str = "libflashdecode.so.0";
    /// The oldest minor version this crate loads. A library older than
    /// [`sys::VERSION_MINOR`] works as that version does; what it lacks
    /// (see [`Library::minor`]) fails with [`Status::Unsupported`](crate::Status::Unsupported),
    /// naming the version it needs, when it is asked for.
    pub const OLDEST_MINOR: u32 = 2;

    /// Loads the library named by `$FLASHDECODE_LIBRARY`, or else by its
    /// SONAME through the dynamic loader's search (`LD_LIBRARY_PATH`, the
    /// ld.so cache); checks that its major version is this crate's.
    pub fn load() -> Result<Library> {
        match std::env::var_os(Self::ENV) {
            Some(path) if !path.is_empty() => Self::open(&path)
                .map_err(|error| Error::load(format!("{} ({}): {}", Self::ENV, path.to_string_lossy(), error))),
            _ => Self::open(Self::SONAME).map_err(|error| {
                Error::load(format!(
                    "{}; set {} to the library's path, or install it",
                    error,
                    Self::ENV
                ))
            }),
        }
    }

    /// Loads the library at `path` (a path, or a file name the dynamic loader searches for).
    pub fn open<P: AsRef<OsStr>>(path: P) -> Result<Library> {
        let name = path.as_ref();
        let c_name = CString::new(name.as_bytes())
            .map_err(|_| Error::load(format!("{}: the path contains a NUL byte", name.to_string_lossy())))?;
        // SAFETY: loading runs the library's initialisers; libflashdecode's are plain C++ statics.
        let dl = unsafe { dlopen(c_name.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        if dl.is_null() {
            return Err(Error::load(format!(
                "cannot load {}: {}",
                name.to_string_lossy(),
                last_dl_error()
            )));
        }
        let functions = match check_version_first(dl, name).and_then(|minor| resolve_functions(dl, name, minor)) {
            Ok(functions) => functions,
            Err(error) => {
                // SAFETY: nothing from this library is in use yet.
                unsafe { dlclose(dl) };
                return Err(error);
            }
        };
        // From here `Loaded` owns `dl`: dropping it on an error below closes it.
        let mut loaded = Loaded {
            dl,
            functions,
            path: PathBuf::from(name),
            version: String::new(),
            version_number: 0,
        };
        if let Some(file) = loaded_file(loaded.functions.fd_version_number as *const c_void) {
            loaded.path = file;
        }
        // SAFETY: both take no arguments and return a number or a static string.
        loaded.version_number = unsafe { (loaded.functions.fd_version_number)() };
        loaded.version = unsafe { CStr::from_ptr((loaded.functions.fd_version_string)()) }
            .to_string_lossy()
            .into_owned();
        check_compatible(&loaded)?;
        Ok(Library {
            inner: Arc::new(loaded),
        })
    }

    /// The file the dynamic loader mapped (symlinks resolved).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The library's version string, e.g. `"0.1.0"`.
    pub fn version(&self) -> &str {
        &self.inner.version
    }

    /// The library's version as `major * 10000 + minor * 100 + patch`.
    pub fn version_number(&self) -> u32 {
        self.inner.version_number
    }

    /// The library's minor version: what it has of the API. 0.3 added
    /// content checks ([`Options::check_contents`](crate::Options::check_contents),
    /// [`Handle::check_contents`](crate::Handle::check_contents)),
    /// [`DecodeArgs::split_tokens`](crate::DecodeArgs::split_tokens),
    /// [`Handle::merge_states`](crate::Handle::merge_states), and several
    /// query tokens with the attention variants ([`DecodeArgs::mask`](crate::DecodeArgs::mask) and the rest).
    pub fn minor(&self) -> u32 {
        self.inner.version_number / 100 % 100
    }

    /// `Ok` if the library has minor version `minor` or later, else the
    /// [`Status::Unsupported`](crate::Status::Unsupported) error for `feature`.
    pub(crate) fn require(&self, minor: u32, feature: &str) -> Result<()> {
        if self.minor() >= minor {
            return Ok(());
        }
        Err(Error::refused(
            crate::Status::Unsupported,
            format!(
                "{} needs libflashdecode {}.{} or later; {} is version {}",
                feature,
                sys::VERSION_MAJOR,
                minor,
                self.inner.path.display(),
                self.inner.version
            ),
        ))
    }

    /// The raw C functions, for what the safe API does not cover.
    pub fn functions(&self) -> &sys::Functions {
        &self.inner.functions
    }

    /// The calling thread's last detailed error message (`fd_last_error_message`).
    pub(crate) fn last_error_message(&self) -> String {
        let functions = &self.inner.functions;
        // SAFETY: a null buffer with size 0 only queries the length; then the
        // buffer is as large as promised.
        unsafe {
            let length = (functions.fd_last_error_message)(std::ptr::null_mut(), 0);
            let mut buffer = vec![0u8; length + 1];
            (functions.fd_last_error_message)(buffer.as_mut_ptr() as *mut c_char, buffer.len());
            buffer.truncate(length);
            String::from_utf8_lossy(&buffer).into_owned()
        }
    }

    /// `Ok` for `FD_SUCCESS`, else the error with this thread's message.
    /// Must directly follow the call, on the same thread: the message is thread-local.
    pub(crate) fn check(&self, status: sys::fd_status) -> Result<()> {
        if status == 0 {
            Ok(())
        } else {
            Err(Error::from_call(status, self.last_error_message()))
        }
    }
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.inner.path)
            .field("version", &self.inner.version)
            .finish()
    }
}

fn last_dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated, thread-local message.
    let message = unsafe { dlerror() };
    if message.is_null() {
        "unknown dlopen error".to_owned()
    } else {
        unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
    }
}

/// A function pointer of type `F` for `symbol` (NUL-terminated).
///
/// # Safety
/// `F` must be the `extern "C"` function pointer type of that symbol.
unsafe fn symbol<F: Copy>(dl: *mut c_void, symbol: &'static str, library: &OsStr) -> Result<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: `dl` is a live dlopen handle and `symbol` is NUL-terminated.
    let address = unsafe { dlsym(dl, symbol.as_ptr() as *const c_char) };
    if address.is_null() {
        return Err(Error::load(format!(
            "{}: does not export {}; not a flashdecode library?",
            library.to_string_lossy(),
            symbol.trim_end_matches('\0')
        )));
    }
    // SAFETY: the caller names the symbol's type; sizes match (checked above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
}

/// The version before the other functions: an older library lacks later
/// ones, and its version is the useful message. Returns the minor version.
fn check_version_first(dl: *mut c_void, library: &OsStr) -> Result<u32> {
    // SAFETY: the declarations of the two symbols; both take no arguments and
    // return a number or a static string.
    let (number, text) = unsafe {
        let number: unsafe extern "C" fn() -> c_uint = symbol(dl, "fd_version_number\0", library)?;
        let text: unsafe extern "C" fn() -> *const c_char = symbol(dl, "fd_version_string\0", library)?;
        (number(), CStr::from_ptr(text()).to_string_lossy().into_owned())
    };
    check_version(Path::new(library), number, &text)?;
    Ok(number / 100 % 100)
}

/// The major version must be this crate's and the minor at least
/// [`Library::OLDEST_MINOR`].
fn check_version(path: &Path, version_number: u32, version: &str) -> Result<()> {
    let (major, minor) = (version_number / 10000, version_number / 100 % 100);
    if major != sys::VERSION_MAJOR || minor < Library::OLDEST_MINOR {
        return Err(Error::load(format!(
            "{} is version {}; this crate needs {}.x with x >= {}",
            path.display(),
            version,
            sys::VERSION_MAJOR,
            Library::OLDEST_MINOR
        )));
    }
    Ok(())
}

/// Every function; one added after minor version 0.2 is required only of a
/// library of that minor or later.
fn resolve_functions(dl: *mut c_void, library: &OsStr, minor: u32) -> Result<sys::Functions> {
    /// A function of minor version `since`: `None` in an older library.
    ///
    /// # Safety
    /// As for [`symbol`].
    unsafe fn optional<F: Copy>(
        dl: *mut c_void,
        name: &'static str,
        library: &OsStr,
        since: u32,
        minor: u32,
    ) -> Result<Option<F>> {
        // SAFETY: the caller's promise.
        match unsafe { symbol(dl, name, library) } {
            Ok(function) => Ok(Some(function)),
            Err(_) if minor < since => Ok(None),
            Err(error) => Err(error),
        }
    }
    macro_rules! resolve {
        ($($name:ident),* $(,)?; $($later:ident since $since:expr),* $(,)?) => {
            // SAFETY: each field's type is the declaration of the symbol of the same name.
            unsafe {
                sys::Functions {
                    $($name: symbol(dl, concat!(stringify!($name), "\0"), library)?,)*
                    $($later: optional(dl, concat!(stringify!($later), "\0"), library, $since, minor)?,)*
                }
            }
        };
    }
    let functions = resolve!(
        fd_version_number,
        fd_version_string,
        fd_status_string,
        fd_last_error_message,
        fd_options_init,
        fd_decode_args_init,
        fd_create,
        fd_destroy,
        fd_get_backend,
        fd_decode,
        fd_workspace_size,
        fd_reserve_workspace,
        fd_set_workspace,
        fd_plan_info_init,
        fd_describe_plan;
        fd_check_contents since 3,
        fd_merge_args_init since 3,
        fd_merge_states since 3,
        fd_append_args_init since 3,
        fd_append_kv since 3,
    );
    Ok(functions)
}

fn loaded_file(address: *const c_void) -> Option<PathBuf> {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    if unsafe { dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(OsStr::from_bytes(name.to_bytes())).ok()
}

/// The size of a struct in a library of an older minor version than this
/// crate's: where the first field that a later minor added begins (later
/// minors append only past every earlier sizeof).
pub(crate) fn struct_size_of_minor(name: &str, minor: u32) -> usize {
    // Byte offsets without offset_of! (Rust 1.77; this crate builds with 1.63).
    fn offset<S, F>(base: &S, field: &F) -> usize {
        field as *const F as usize - base as *const S as usize
    }
    let (options, args, info) = (
        sys::fd_options::default(),
        sys::fd_decode_args::default(),
        sys::fd_plan_info::default(),
    );
    // (struct, field, the minor that added it): after 0.2.
    let added = [
        ("fd_options", offset(&options, &options.checks), 3),
        ("fd_decode_args", offset(&args, &args.split_tokens), 3),
        ("fd_decode_args", offset(&args, &args.mask), 3),
        ("fd_decode_args", offset(&args, &args.logit_softcap), 3),
        ("fd_decode_args", offset(&args, &args.window_left), 3),
        ("fd_decode_args", offset(&args, &args.alibi_slopes), 3),
        ("fd_decode_args", offset(&args, &args.sinks), 3),
        ("fd_decode_args", offset(&args, &args.k_scale), 3),
        ("fd_decode_args", offset(&args, &args.v_scale), 3),
        ("fd_decode_args", offset(&args, &args.q_lens), 3),
        ("fd_plan_info", offset(&info, &info.schedule), 3),
    ];
    let ours = match name {
        "fd_options" => std::mem::size_of::<sys::fd_options>(),
        "fd_decode_args" => std::mem::size_of::<sys::fd_decode_args>(),
        "fd_merge_args" => std::mem::size_of::<sys::fd_merge_args>(),
        "fd_append_args" => std::mem::size_of::<sys::fd_append_args>(),
        _ => std::mem::size_of::<sys::fd_plan_info>(),
    };
    added
        .iter()
        .filter(|&&(struct_name, _, since)| struct_name == name && since > minor)
        .map(|&(_, offset, _)| offset)
        .min()
        .unwrap_or(ours)
}

/// The major version must be this crate's and the minor at least
/// [`Library::OLDEST_MINOR`]; the struct sizes the library reports must be
/// this crate's (at least, for a newer library; that minor's, for an older one).
fn check_compatible(loaded: &Loaded) -> Result<()> {
    check_version(&loaded.path, loaded.version_number, &loaded.version)?;
    let minor = loaded.version_number / 100 % 100;
    // The init functions return the library's sizeof; a null struct asks
    // for nothing else.
    let mut sizes = unsafe {
        vec![
            (
                "fd_options",
                (loaded.functions.fd_options_init)(std::ptr::null_mut(), 0),
                std::mem::size_of::<sys::fd_options>(),
            ),
            (
                "fd_decode_args",
                (loaded.functions.fd_decode_args_init)(std::ptr::null_mut(), 0),
                std::mem::size_of::<sys::fd_decode_args>(),
            ),
            (
                "fd_plan_info",
                (loaded.functions.fd_plan_info_init)(std::ptr::null_mut(), 0),
                std::mem::size_of::<sys::fd_plan_info>(),
            ),
        ]
    };
    // A struct of 0.3: an older library has none to compare.
    if let Some(init) = loaded.functions.fd_merge_args_init {
        sizes.push((
            "fd_merge_args",
            // SAFETY: as above.
            unsafe { init(std::ptr::null_mut(), 0) },
            std::mem::size_of::<sys::fd_merge_args>(),
        ));
    }
    if let Some(init) = loaded.functions.fd_append_args_init {
        sizes.push((
            "fd_append_args",
            // SAFETY: as above.
            unsafe { init(std::ptr::null_mut(), 0) },
            std::mem::size_of::<sys::fd_append_args>(),
        ));
    }
    for (name, library_size, ours) in sizes {
        let (expected, wrong) = if minor < sys::VERSION_MINOR {
            let expected = struct_size_of_minor(name, minor);
            (expected, library_size != expected)
        } else {
            (
                ours,
                library_size < ours || (minor == sys::VERSION_MINOR && library_size != ours),
            )
        };
        if wrong {
            return Err(Error::load(format!(
                "{}: its {} is {} bytes, this crate expects {} of version {}.{}: the crate and the library \
                 disagree on the ABI",
                loaded.path.display(),
                name,
                library_size,
                expected,
                sys::VERSION_MAJOR,
                minor
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::struct_size_of_minor;

    #[test]
    fn struct_sizes_of_older_minors() {
        // 0.3 appended its fields where 0.2's structs ended (their padding became reserved_0).
        assert_eq!(struct_size_of_minor("fd_options", 2), 24);
        assert_eq!(struct_size_of_minor("fd_decode_args", 2), 584);
        assert_eq!(struct_size_of_minor("fd_plan_info", 2), 56);
        assert_eq!(struct_size_of_minor("fd_options", 3), 32);
        assert_eq!(struct_size_of_minor("fd_decode_args", 3), 1008);
        assert_eq!(struct_size_of_minor("fd_append_args", 3), 648);
        assert_eq!(struct_size_of_minor("fd_merge_args", 3), 192);
        assert_eq!(struct_size_of_minor("fd_plan_info", 3), 64);
    }

    #[test]
    fn attention_variant_fields_sit_where_the_header_puts_them() {
        // C's offsetof on LP64: a misplaced field would pass the size check and be read as another.
        fn offset<S, F>(base: &S, field: &F) -> usize {
            field as *const F as usize - base as *const S as usize
        }
        let args = crate::sys::fd_decode_args::default();
        assert_eq!(offset(&args, &args.split_tokens), 584);
        assert_eq!(offset(&args, &args.mask), 592);
        assert_eq!(offset(&args, &args.logit_softcap), 596);
        assert_eq!(offset(&args, &args.window_left), 600);
        assert_eq!(offset(&args, &args.alibi_slopes), 608);
        assert_eq!(offset(&args, &args.sinks), 688);
        assert_eq!(offset(&args, &args.k_scale), 768);
        assert_eq!(offset(&args, &args.v_scale), 848);
        assert_eq!(offset(&args, &args.q_lens), 928);
        assert_eq!(std::mem::size_of::<crate::sys::fd_decode_args>(), 1008);
    }
}
