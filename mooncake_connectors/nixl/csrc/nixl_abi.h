// Our own declarations of the NIXL backend-plugin ABI, as found in nixl 1.5.1.
//
// Why not NIXL's headers: the nixl wheels ship none, and this project copies no NIXL source.
// What must agree with the library is only what crosses the boundary: the plugin struct, the
// order of the engine's virtual methods (the vtable: 2 destructor slots + 27 methods = 29
// words with the offset-to-top and RTTI words, which `mooncake_nixl_plugin` checks against a
// bundled plugin before installing), the layout of the engine's base members (the NIXL core
// reads them through inline accessors), and the layout of the argument types. Names here are
// ours; types are chosen so that g++ lays them out exactly as the core expects (libstdc++,
// C++20, _GLIBCXX_USE_CXX11_ABI=1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mcnixl {

// ---------------------------------------------------------------- enums (values fixed by the ABI)
enum MemKind { MEM_DRAM = 0, MEM_VRAM = 1, MEM_BLOCK = 2, MEM_OBJECT = 3, MEM_FILE = 4 };
enum XferOp { OP_READ = 0, OP_WRITE = 1 };
enum Status {
    ST_IN_PROG = 1,
    ST_SUCCESS = 0,
    ST_ERR_NOT_POSTED = -1,
    ST_ERR_INVALID_PARAM = -2,
    ST_ERR_BACKEND = -3,
    ST_ERR_NOT_FOUND = -4,
    ST_ERR_MISMATCH = -5,
    ST_ERR_NOT_ALLOWED = -6,
    ST_ERR_REPOST_ACTIVE = -7,
    ST_ERR_UNKNOWN = -8,
    ST_ERR_NOT_SUPPORTED = -9,
    ST_ERR_REMOTE_DISCONNECT = -10,
    ST_ERR_CANCELED = -11,
    ST_ERR_NO_TELEMETRY = -12,
};
enum class ThreadSync { NONE, STRICT, RW };

using Params = std::unordered_map<std::string, std::string>;
using MemList = std::vector<MemKind>;
using NotifList = std::vector<std::pair<std::string, std::string>>;  // (sender agent, message)

// ---------------------------------------------------------------- backend-owned objects
// Metadata the backend hands to the core (one per registration / loaded remote region).
// Layout: vptr, then one flag.
class BackendMeta {
  protected:
    bool private_;

  public:
    explicit BackendMeta(bool is_private) : private_(is_private) {}
    virtual ~BackendMeta() {}
};

// A prepared transfer, owned by the backend (the core only passes the pointer around).
class BackendRequest {
  public:
    BackendRequest() {}
    virtual ~BackendRequest() {}
};

// ---------------------------------------------------------------- argument types (read-only views)
struct AddrRange {  // 24 bytes: address, length, device id
    uintptr_t addr;
    size_t len;
    uint64_t dev;
};
struct MetaRange : AddrRange {  // 32 bytes: + the backend metadata of the containing region
    BackendMeta *meta;
};
struct BlobRange : AddrRange {  // 56 bytes: + opaque per-registration info
    std::string info;
};

// A descriptor list as the core lays it out (40 bytes): it has virtual methods (vptr), then
// the memory kind, then a std::vector of entries. We only read it, through this view.
template <class Entry> struct DescListView {
    const void *vptr_;
    MemKind kind;
    std::vector<Entry> entries;
};
using MetaList = DescListView<MetaRange>;
using BlobList = DescListView<BlobRange>;

// Optional arguments of prepare/post (notification to deliver after the data).
struct OptArgs {
    std::string notif_msg;
    bool has_notif = false;
    std::string custom;
};

// What the core passes to create_engine.
struct InitParams {
    std::string local_agent;
    std::string backend_type;
    Params *custom = nullptr;
    bool progress_thread = false;
    uint64_t progress_delay_us = 0;
    ThreadSync sync_mode;
    bool telemetry = false;
};

// Telemetry events live in a vector of the engine base; we never add any (the element type
// matters only for elements that exist).
struct TelemetryEventSlot {
    uint32_t kind;
    uint64_t value;
};

// ---------------------------------------------------------------- the engine interface
// Member order and types reproduce the base layout the core reads: type, custom params,
// telemetry events + their mutex (private), then init-error flag, local agent name and
// telemetry flag (visible to the backend).
class EngineBase {
  private:
    std::string type_;
    Params params_;
    std::vector<TelemetryEventSlot> telemetry_events_;
    std::mutex telemetry_mutex_;

  protected:
    bool init_error_ = false;
    const std::string local_agent_;
    const bool telemetry_enabled_;

    const Params &params() const { return params_; }

  public:
    explicit EngineBase(const InitParams *p)
        : type_(p->backend_type), params_(*p->custom), local_agent_(p->local_agent),
          telemetry_enabled_(p->telemetry) {}
    EngineBase(const EngineBase &) = delete;
    EngineBase &operator=(const EngineBase &) = delete;
    virtual ~EngineBase() = default;  // vtable slots 0, 1

    // capabilities (slots 2-5)
    virtual bool remoteCapable() const = 0;
    virtual bool localCapable() const = 0;
    virtual bool notifCapable() const = 0;
    virtual MemList memKinds() const = 0;

    // memory and peers (slots 6-10)
    virtual Status addMemory(const BlobRange &mem, const MemKind &kind, BackendMeta *&out) = 0;
    virtual Status dropMemory(BackendMeta *meta) = 0;
    virtual Status connectPeer(const std::string &agent) = 0;
    virtual Status disconnectPeer(const std::string &agent) = 0;
    virtual Status dropMeta(BackendMeta *meta) = 0;

    // transfers (slots 11-14)
    virtual Status prepare(const XferOp &op, const MetaList &local, const MetaList &remote,
                           const std::string &agent, BackendRequest *&req, const OptArgs *opt) const = 0;
    virtual Status post(const XferOp &op, const MetaList &local, const MetaList &remote,
                        const std::string &agent, BackendRequest *&req, const OptArgs *opt) const = 0;
    virtual Status poll(BackendRequest *req) const = 0;
    virtual Status release(BackendRequest *req) const = 0;

    // memory views (slots 15-17): not offered
    virtual Status memViewRemote(const void *, void *&, const OptArgs *) const { return ST_ERR_NOT_SUPPORTED; }
    virtual Status memViewLocal(const MetaList &, void *&, const OptArgs *) const { return ST_ERR_NOT_SUPPORTED; }
    virtual void memViewRelease(void *) const {}

    // remote metadata (slots 18-21)
    virtual Status publicData(const BackendMeta *, std::string &) const { return ST_ERR_BACKEND; }
    virtual Status connInfo(std::string &) const { return ST_ERR_BACKEND; }
    virtual Status loadConnInfo(const std::string &, const std::string &) { return ST_ERR_BACKEND; }
    virtual Status loadRemoteMeta(const BlobRange &, const MemKind &, const std::string &, BackendMeta *&) {
        return ST_ERR_BACKEND;
    }

    // local metadata (slot 22)
    virtual Status loadLocalMeta(BackendMeta *, BackendMeta *&) { return ST_ERR_BACKEND; }

    // notifications (slots 23-24)
    virtual Status takeNotifs(NotifList &) { return ST_ERR_BACKEND; }
    virtual Status sendNotif(const std::string &, const std::string &) const { return ST_ERR_BACKEND; }

    // optional queries (slots 25-26): not offered
    virtual Status queryMemory(const BlobList &, void *) const { return ST_ERR_NOT_SUPPORTED; }
    virtual Status estimateCost(const XferOp &, const MetaList &, const MetaList &, const std::string &,
                                BackendRequest *const &, void *, void *, void *, const void *) const {
        return ST_ERR_NOT_SUPPORTED;
    }
};

// ---------------------------------------------------------------- the plugin struct
constexpr int kPluginApiVersion = 1;

struct Plugin {
    int api_version;
    EngineBase *(*create_engine)(const InitParams *);
    void (*destroy_engine)(EngineBase *);
    const char *(*plugin_name)();
    const char *(*plugin_version)();
    Params (*backend_options)();
    MemList (*backend_mems)();
};

// Sizes the core relies on (checked at compile time so a wrong declaration cannot ship).
static_assert(sizeof(AddrRange) == 24);
static_assert(sizeof(MetaRange) == 32);
static_assert(sizeof(BlobRange) == 56);
static_assert(sizeof(DescListView<MetaRange>) == 40);
static_assert(sizeof(OptArgs) == 72);
static_assert(sizeof(MemKind) == 4);

}  // namespace mcnixl
