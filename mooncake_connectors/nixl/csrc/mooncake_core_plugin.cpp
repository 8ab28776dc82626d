// NIXL backend plugin "MooncakeCore": NIXL transfers on mooncake-core's Transfer Engine.
//
// Design (docs/nixl.md): this library is a thin adapter. It answers NIXL's capability and
// bookkeeping questions itself (never touching Python), and hands everything that moves
// bytes or registers memory to the Python adapter `mooncake_connectors.nixl.backend`, which
// drives `mooncake_core.engine.TransferEngine` through its public API. The TE picks the
// transport per peer (memmove in-process, cross-memory attach on one host, tcp otherwise).
//
// Threads and the GIL:
// * postXfer only queues the prepared request and returns IN_PROG (no GIL);
// * a small pool of worker threads takes the GIL, runs the transfer synchronously in the
//   TE (which releases the GIL in its syscalls and socket waits) and stores the result in an
//   atomic status;
// * checkXfer reads that atomic (no GIL);
// * registerMem / deregisterMem / getNotifs / genNotif take the GIL for one call each;
// * waits on our own workers (releasing an in-flight request, destruction) drop the GIL
//   first when the calling thread holds it, so a worker that needs it can finish.
// Built with the system g++ by `mooncake_nixl_plugin install` (no NIXL headers: nixl_abi.h).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "nixl_abi.h"
#include "pyapi.h"

#ifndef MOONCAKE_NIXL_VERSION
#define MOONCAKE_NIXL_VERSION "0.1.0"
#endif
#ifndef MOONCAKE_NIXL_BUILD_ID
#define MOONCAKE_NIXL_BUILD_ID "dev"
#endif

#define MC_EXPORT __attribute__((visibility("default")))

// Read by `mooncake_nixl_plugin` to tell whether an installed copy matches the shipped source.
extern "C" MC_EXPORT const char mooncake_core_nixl_build_id[] =
    "mooncake-core-nixl-build:" MOONCAKE_NIXL_BUILD_ID;

namespace mcnixl {
namespace {

constexpr const char *kBackendName = "MooncakeCore";
constexpr const char *kAdapterModule = "mooncake_connectors.nixl.backend";
constexpr long long kAdapterAbi = 2;  // must equal ADAPTER_ABI in backend.py
// Connection info and public metadata are versioned so that peers built from different
// releases refuse each other with a message instead of misreading each other.
constexpr const char *kConnPrefix = "mooncake-core-nixl/1 ";
constexpr const char *kMetaPrefix = "mc1:";
constexpr int kPollPauseUs = 20;  // pause of a checkXfer that finds the request still in flight

// The memory kinds the Transfer Engine moves: host memory and GPU memory (`cuda:N` regions).
MemList backend_mems() { return {MEM_DRAM, MEM_VRAM}; }
bool movable(MemKind kind) { return kind == MEM_DRAM || kind == MEM_VRAM; }

void log_error(const std::string &msg) { std::fprintf(stderr, "[MooncakeCore] error: %s\n", msg.c_str()); }

// The Python C API of this process, resolved once; `why` says what is missing when unusable.
const PyApi &python(bool &ok, std::string &why) {
    static PyApi api;
    static bool loaded = false;
    static std::string missing;
    static std::once_flag once;
    std::call_once(once, [] { loaded = api.load(missing); });
    ok = loaded;
    why = missing;
    return api;
}

const PyApi &python() {
    bool ok;
    std::string why;
    return python(ok, why);
}

// ------------------------------------------------------------------ metadata objects
struct LocalRegion final : BackendMeta {
    LocalRegion(uintptr_t a, size_t n) : BackendMeta(true), addr(a), len(n) {}
    uintptr_t addr;
    size_t len;
};

struct PeerRegion final : BackendMeta {
    PeerRegion(std::string a, uintptr_t ad, size_t n) : BackendMeta(false), agent(std::move(a)), addr(ad), len(n) {}
    std::string agent;
    uintptr_t addr;
    size_t len;
};

// ------------------------------------------------------------------ requests
// What one prepared request moves: fixed at prepXfer, shared with queued jobs.
struct Payload {
    bool write = false;
    std::string agent;
    std::string segment;
    size_t count = 0;
    std::string words;  // count x (local, remote, length) as native uint64, column by column
};

// One posting of a request: the atomic status checkXfer reads, and a completion signal for
// waiters (release of an in-flight request, destruction).
struct Posting {
    enum Phase { QUEUED = 0, RUNNING = 1, CANCELLED = 2 };
    std::atomic<int> status{ST_IN_PROG};
    std::atomic<int> phase{QUEUED};  // QUEUED -> RUNNING (worker) or QUEUED -> CANCELLED (release)
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;

    void finish(int st) {
        status.store(st, std::memory_order_release);
        std::lock_guard<std::mutex> g(mu);
        finished = true;
        cv.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [this] { return finished; });
    }
};

struct Request final : BackendRequest {
    std::shared_ptr<const Payload> payload;
    std::shared_ptr<Posting> current;  // null until posted
};

struct Job {
    std::shared_ptr<const Payload> payload;
    std::shared_ptr<Posting> posting;
    bool has_notif = false;
    std::string notif;
};

// ------------------------------------------------------------------ Python adapter handle
// Bound methods of the adapter object, looked up once.
struct Adapter {
    PyObj *obj = nullptr;
    PyObj *transfer = nullptr;
    PyObj *notify = nullptr;
    PyObj *drain = nullptr;
    PyObj *reg = nullptr;
    PyObj *dereg = nullptr;
    PyObj *close = nullptr;

    void drop(const PyApi &py) {
        for (PyObj **p : {&transfer, &notify, &drain, &reg, &dereg, &close, &obj}) {
            if (*p != nullptr) py.DecRef(*p);
            *p = nullptr;
        }
    }
};

// Build an argument tuple from owned references (nullptr entries make the call fail).
PyObj *make_args(const PyApi &py, std::initializer_list<PyObj *> items) {
    PyObj *t = py.Tuple_New(static_cast<ssize_t>(items.size()));
    ssize_t i = 0;
    for (PyObj *it : items) {
        if (t == nullptr || it == nullptr) {
            if (it != nullptr) py.DecRef(it);
            continue;
        }
        py.Tuple_SetItem(t, i++, it);
    }
    if (t != nullptr && i != static_cast<ssize_t>(items.size())) {
        py.DecRef(t);
        return nullptr;
    }
    return t;
}

PyObj *bytes_of(const PyApi &py, const std::string &s) {
    return py.Bytes_FromStringAndSize(s.data(), static_cast<ssize_t>(s.size()));
}

// Call `fn(*args)` and return its int result; on a Python exception print it and return
// `on_error`. The GIL must be held.
long long call_int(const PyApi &py, PyObj *fn, PyObj *args, long long on_error, const char *what) {
    if (args == nullptr) {
        py.Err_Print();
        log_error(std::string("could not build the arguments of ") + what);
        return on_error;
    }
    PyRef res(py, py.Object_CallObject(fn, args));
    py.DecRef(args);
    if (!res) {
        log_error(std::string("the Python adapter raised in ") + what + ":");
        py.Err_Print();
        return on_error;
    }
    long long v = py.Long_AsLongLong(res.get());
    if (v == -1 && py.Err_Occurred() != nullptr) {
        py.Err_Clear();
        log_error(std::string("the Python adapter's ") + what + " did not return an int");
        return on_error;
    }
    return v;
}

// ------------------------------------------------------------------ shared runtime
// Owned jointly by the engine and its worker threads, so a worker that outlives the engine
// (detached at interpreter shutdown) never touches freed memory.
class Runtime {
  public:
    explicit Runtime(const PyApi &py) : py_(py) {}

    Adapter adapter;

    void push(Job job) {
        {
            std::lock_guard<std::mutex> g(mu_);
            queue_.push_back(std::move(job));
        }
        cv_.notify_one();
    }

    void stop() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
    }

    static void worker(std::shared_ptr<Runtime> rt) {
        Job job;
        while (rt->pop(job)) {
            rt->run(job);
            job = Job();
        }
    }

  private:
    bool pop(Job &out) {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return false;
        out = std::move(queue_.front());
        queue_.pop_front();
        return true;
    }

    void run(Job &job) {
        int queued = Posting::QUEUED;
        if (!job.posting->phase.compare_exchange_strong(queued, Posting::RUNNING)) {
            return;  // released before it started: already finished as cancelled
        }
        if (stopping_now() || !py_.alive()) {
            job.posting->finish(ST_ERR_BACKEND);
            return;
        }
        long long st;
        {
            GilHold gil(py_);
            const Payload &p = *job.payload;
            PyObj *notif = nullptr;
            if (job.has_notif) {
                notif = bytes_of(py_, job.notif);
            } else {
                py_.IncRef(py_.None);
                notif = py_.None;
            }
            PyObj *args = make_args(py_, {bytes_of(py_, p.segment), py_.Long_FromLongLong(p.write ? 1 : 0),
                                          bytes_of(py_, p.words), py_.Long_FromUnsignedLongLong(p.count), notif});
            st = call_int(py_, adapter.transfer, args, ST_ERR_BACKEND, "transfer");
        }
        if (st > 0) st = ST_ERR_UNKNOWN;  // the adapter answers only when done: 0 or an error
        job.posting->finish(static_cast<int>(st));
    }

    bool stopping_now() {
        std::lock_guard<std::mutex> g(mu_);
        return stopping_;
    }

    const PyApi &py_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> queue_;
    bool stopping_ = false;
};

// ------------------------------------------------------------------ the engine
class MooncakeCoreEngine final : public EngineBase {
  public:
    explicit MooncakeCoreEngine(const InitParams *p) : EngineBase(p), py_(python()) {
        bool ok = false;
        std::string missing;
        python(ok, missing);
        if (!ok) {
            log_error(missing.empty() ? "the Python interpreter of this process is not initialized"
                                      : "this process has no Python interpreter (missing " + missing +
                                            "); MooncakeCore runs inside a Python process that has "
                                            "mooncake-core installed");
            init_error_ = true;
            return;
        }
        if (py_.IsFinalizing()) {
            log_error("the Python interpreter is shutting down");
            init_error_ = true;
            return;
        }
        rt_ = std::make_shared<Runtime>(py_);
        long long workers = 0;
        {
            GilHold gil(py_);
            if (!create_adapter(workers)) {
                rt_->adapter.drop(py_);
                rt_.reset();
                init_error_ = true;
                return;
            }
        }
        for (long long i = 0; i < workers; ++i) workers_.emplace_back(Runtime::worker, rt_);
    }

    ~MooncakeCoreEngine() override {
        if (!rt_) return;
        rt_->stop();
        if (py_.alive()) {
            {
                GilDrop nogil(py_);
                for (auto &t : workers_) t.join();
            }
            GilHold gil(py_);
            if (rt_->adapter.close != nullptr) {
                call_int(py_, rt_->adapter.close, make_args(py_, {}), -1, "close");
            }
            rt_->adapter.drop(py_);
        } else {
            // Interpreter shutting down: workers may be parked on the GIL for good. They own a
            // share of the runtime, so detaching them is safe; the process is exiting.
            for (auto &t : workers_) t.detach();
        }
    }

    // ---------------------------------------------------------------- capabilities (no Python)
    bool remoteCapable() const override { return true; }
    bool localCapable() const override { return true; }
    bool notifCapable() const override { return true; }
    MemList memKinds() const override { return backend_mems(); }

    // ---------------------------------------------------------------- memory
    // VRAM goes to the engine as a `cuda:<devId>` region (served by its cuda plugin or UCX);
    // where the engine has no GPU transport the adapter refuses it with the engine's reason.
    Status addMemory(const BlobRange &mem, const MemKind &kind, BackendMeta *&out) override {
        if (!movable(kind)) {
            log_error("only DRAM and VRAM can be registered with MooncakeCore (got memory kind " +
                      std::to_string(static_cast<int>(kind)) + ")");
            return ST_ERR_NOT_SUPPORTED;
        }
        if (!py_.alive()) return ST_ERR_BACKEND;
        const long long device = kind == MEM_VRAM ? static_cast<long long>(mem.dev) : -1;
        long long rc;
        {
            GilHold gil(py_);
            rc = call_int(py_, rt_->adapter.reg,
                          make_args(py_, {py_.Long_FromUnsignedLongLong(mem.addr),
                                          py_.Long_FromUnsignedLongLong(mem.len), py_.Long_FromLongLong(device)}),
                          ST_ERR_BACKEND, "register");
        }
        if (rc != 0) return rc < 0 ? static_cast<Status>(rc) : ST_ERR_BACKEND;
        out = new LocalRegion(mem.addr, mem.len);
        return ST_SUCCESS;
    }

    Status dropMemory(BackendMeta *meta) override {
        auto *r = dynamic_cast<LocalRegion *>(meta);
        if (r == nullptr) return ST_ERR_INVALID_PARAM;
        long long rc = ST_ERR_BACKEND;
        if (py_.alive()) {
            GilHold gil(py_);
            rc = call_int(py_, rt_->adapter.dereg, make_args(py_, {py_.Long_FromUnsignedLongLong(r->addr)}),
                          ST_ERR_BACKEND, "deregister");
        }
        delete r;
        return rc == 0 ? ST_SUCCESS : ST_ERR_BACKEND;
    }

    // ---------------------------------------------------------------- peers (no Python)
    Status connectPeer(const std::string &agent) override {
        if (agent == local_agent_) return ST_SUCCESS;
        std::lock_guard<std::mutex> g(peers_mu_);
        return peers_.count(agent) ? ST_SUCCESS : ST_ERR_NOT_FOUND;  // the TE connects lazily
    }

    Status disconnectPeer(const std::string &agent) override {
        if (agent == local_agent_) return ST_SUCCESS;
        std::lock_guard<std::mutex> g(peers_mu_);
        peers_.erase(agent);
        return ST_SUCCESS;
    }

    Status dropMeta(BackendMeta *meta) override {
        auto *r = dynamic_cast<PeerRegion *>(meta);
        if (r == nullptr) return ST_ERR_INVALID_PARAM;
        delete r;
        return ST_SUCCESS;
    }

    Status publicData(const BackendMeta *meta, std::string &out) const override {
        auto *r = dynamic_cast<const LocalRegion *>(meta);
        if (r == nullptr) return ST_ERR_INVALID_PARAM;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%lx:%lx", kMetaPrefix, static_cast<unsigned long>(r->addr),
                      static_cast<unsigned long>(r->len));
        out = buf;
        return ST_SUCCESS;
    }

    Status connInfo(std::string &out) const override {
        out = kConnPrefix + segment_;
        return ST_SUCCESS;
    }

    Status loadConnInfo(const std::string &agent, const std::string &info) override {
        const size_t n = std::strlen(kConnPrefix);
        if (info.compare(0, n, kConnPrefix) != 0 || info.size() == n) {
            log_error("agent '" + agent + "' sent MooncakeCore connection info '" + info.substr(0, 40) +
                      "', expected '" + std::string(kConnPrefix) +
                      "<segment>': its mooncake-core NIXL plugin is of another version");
            return ST_ERR_MISMATCH;
        }
        std::lock_guard<std::mutex> g(peers_mu_);
        peers_[agent] = info.substr(n);
        return ST_SUCCESS;
    }

    Status loadRemoteMeta(const BlobRange &blob, const MemKind &kind, const std::string &agent,
                          BackendMeta *&out) override {
        if (!movable(kind)) return ST_ERR_NOT_SUPPORTED;
        if (blob.info.compare(0, std::strlen(kMetaPrefix), kMetaPrefix) != 0) {
            log_error("agent '" + agent + "' published region metadata of another MooncakeCore version");
            return ST_ERR_MISMATCH;
        }
        out = new PeerRegion(agent, blob.addr, blob.len);
        return ST_SUCCESS;
    }

    Status loadLocalMeta(BackendMeta *in, BackendMeta *&out) override {
        auto *r = dynamic_cast<LocalRegion *>(in);
        if (r == nullptr) return ST_ERR_INVALID_PARAM;
        out = new PeerRegion(local_agent_, r->addr, r->len);
        return ST_SUCCESS;
    }

    // ---------------------------------------------------------------- transfers
    Status prepare(const XferOp &op, const MetaList &local, const MetaList &remote, const std::string &agent,
                   BackendRequest *&req, const OptArgs *) const override {
        if (op != OP_READ && op != OP_WRITE) return ST_ERR_INVALID_PARAM;
        // any mix of DRAM and VRAM: the engine picks the path per region (cuda IPC, UCX, staging)
        if (!movable(local.kind) || !movable(remote.kind)) return ST_ERR_NOT_SUPPORTED;
        const size_t n = local.entries.size();
        if (remote.entries.size() != n) {
            log_error("prepXfer: " + std::to_string(n) + " local descriptors but " +
                      std::to_string(remote.entries.size()) + " remote ones");
            return ST_ERR_MISMATCH;
        }
        auto p = std::make_shared<Payload>();
        p->write = (op == OP_WRITE);
        p->agent = agent;
        if (!segment_of(agent, p->segment)) {
            log_error("prepXfer: no MooncakeCore connection info for agent '" + agent + "'");
            return ST_ERR_NOT_FOUND;
        }
        p->count = n;
        p->words.resize(3 * n * sizeof(uint64_t));
        auto *w = reinterpret_cast<uint64_t *>(p->words.data());
        for (size_t i = 0; i < n; ++i) {
            const MetaRange &l = local.entries[i];
            const MetaRange &r = remote.entries[i];
            if (l.len != r.len) {
                log_error("prepXfer: descriptor " + std::to_string(i) + " has local length " +
                          std::to_string(l.len) + " but remote length " + std::to_string(r.len));
                return ST_ERR_MISMATCH;
            }
            w[i] = l.addr;
            w[n + i] = r.addr;
            w[2 * n + i] = l.len;
        }
        auto *h = new Request();
        h->payload = std::move(p);
        req = h;
        return ST_SUCCESS;
    }

    Status post(const XferOp &op, const MetaList &local, const MetaList &remote, const std::string &agent,
                BackendRequest *&req, const OptArgs *opt) const override {
        if (req == nullptr) {
            Status st = prepare(op, local, remote, agent, req, opt);
            if (st != ST_SUCCESS) return st;
        }
        auto *h = dynamic_cast<Request *>(req);
        if (h == nullptr || !rt_) return ST_ERR_INVALID_PARAM;
        if (h->current && h->current->status.load(std::memory_order_acquire) == ST_IN_PROG) {
            return ST_ERR_REPOST_ACTIVE;
        }
        const bool notif = opt != nullptr && opt->has_notif;
        auto posting = std::make_shared<Posting>();
        h->current = posting;
        if (h->payload->count == 0 && !notif) {
            posting->finish(ST_SUCCESS);
            return ST_SUCCESS;
        }
        Job job;
        job.payload = h->payload;
        job.posting = posting;
        job.has_notif = notif;
        if (notif) job.notif = opt->notif_msg;
        rt_->push(std::move(job));
        return ST_IN_PROG;
    }

    Status poll(BackendRequest *req) const override {
        auto *h = dynamic_cast<Request *>(req);
        if (h == nullptr) return ST_ERR_INVALID_PARAM;
        if (!h->current) return ST_ERR_NOT_POSTED;
        const int st = h->current->status.load(std::memory_order_acquire);
        if (st == ST_IN_PROG) {
            // A caller spinning on checkXfer from Python re-takes the GIL between checks; our
            // workers need it between the engine's syscalls. Pausing here a few us (outside
            // the GIL: NIXL's binding released it) lets them have it.
            std::this_thread::sleep_for(std::chrono::microseconds(kPollPauseUs));
        }
        return static_cast<Status>(st);
    }

    Status release(BackendRequest *req) const override {
        auto *h = dynamic_cast<Request *>(req);
        if (h == nullptr) return ST_ERR_INVALID_PARAM;
        if (h->current && h->current->status.load(std::memory_order_acquire) == ST_IN_PROG) {
            // Not started yet: cancelled here, the worker skips it. Started: wait until the
            // bytes stopped moving (bounded by the TE's MC_TRANSFER_TIMEOUT), so the caller
            // may free the memory afterwards.
            int queued = Posting::QUEUED;
            if (h->current->phase.compare_exchange_strong(queued, Posting::CANCELLED)) {
                h->current->finish(ST_ERR_CANCELED);
            } else {
                GilDrop nogil(py_);
                h->current->wait();
            }
        }
        delete h;
        return ST_SUCCESS;
    }

    // ---------------------------------------------------------------- notifications
    Status takeNotifs(NotifList &out) override {
        if (!rt_ || !py_.alive()) return ST_SUCCESS;
        GilHold gil(py_);
        PyObj *args = make_args(py_, {});
        PyRef res(py_, args ? py_.Object_CallObject(rt_->adapter.drain, args) : nullptr);
        if (args != nullptr) py_.DecRef(args);
        if (!res) {
            log_error("the Python adapter raised in drain_notifs:");
            py_.Err_Print();
            return ST_ERR_BACKEND;
        }
        const ssize_t n = py_.Sequence_Size(res.get());
        for (ssize_t i = 0; i < n; ++i) {
            PyRef item(py_, py_.Sequence_GetItem(res.get(), i));
            if (!item) break;
            PyRef name(py_, py_.Sequence_GetItem(item.get(), 0));
            PyRef msg(py_, py_.Sequence_GetItem(item.get(), 1));
            char *nb = nullptr, *mb = nullptr;
            ssize_t nl = 0, ml = 0;
            if (!name || !msg || py_.Bytes_AsStringAndSize(name.get(), &nb, &nl) != 0 ||
                py_.Bytes_AsStringAndSize(msg.get(), &mb, &ml) != 0) {
                py_.Err_Clear();
                log_error("drain_notifs returned an entry that is not (bytes, bytes)");
                continue;
            }
            out.emplace_back(std::string(nb, static_cast<size_t>(nl)), std::string(mb, static_cast<size_t>(ml)));
        }
        if (py_.Err_Occurred() != nullptr) py_.Err_Clear();
        return ST_SUCCESS;
    }

    Status sendNotif(const std::string &agent, const std::string &msg) const override {
        std::string segment;
        if (!segment_of(agent, segment)) {
            log_error("genNotif: no MooncakeCore connection info for agent '" + agent + "'");
            return ST_ERR_NOT_FOUND;
        }
        if (!rt_ || !py_.alive()) return ST_ERR_BACKEND;
        GilHold gil(py_);
        long long rc = call_int(py_, rt_->adapter.notify, make_args(py_, {bytes_of(py_, segment), bytes_of(py_, msg)}),
                                ST_ERR_BACKEND, "notify");
        return rc == 0 ? ST_SUCCESS : (rc < 0 ? static_cast<Status>(rc) : ST_ERR_BACKEND);
    }

  private:
    bool segment_of(const std::string &agent, std::string &out) const {
        if (agent == local_agent_) {
            out = segment_;
            return true;
        }
        std::lock_guard<std::mutex> g(peers_mu_);
        auto it = peers_.find(agent);
        if (it == peers_.end()) return false;
        out = it->second;
        return true;
    }

    // GIL held. Imports the adapter module, checks its ABI, creates the adapter and binds its
    // methods. False (error printed) on any failure.
    bool create_adapter(long long &workers) {
        PyRef mod(py_, py_.Import_ImportModule(kAdapterModule));
        if (!mod) {
            log_error(std::string("cannot import ") + kAdapterModule + " (is mooncake-core installed in this Python?):");
            py_.Err_Print();
            return false;
        }
        PyRef abi(py_, py_.Object_GetAttrString(mod.get(), "ADAPTER_ABI"));
        long long abi_v = abi ? py_.Long_AsLongLong(abi.get()) : -1;
        if (abi_v != kAdapterAbi) {
            py_.Err_Clear();
            log_error("this libplugin_MooncakeCore.so speaks adapter ABI " + std::to_string(kAdapterAbi) + " but " +
                      kAdapterModule + " speaks " + std::to_string(abi_v) +
                      ": rebuild it with `mooncake_nixl_plugin install`");
            return false;
        }
        PyRef create(py_, py_.Object_GetAttrString(mod.get(), "create"));
        if (!create) {
            py_.Err_Print();
            return false;
        }
        // params as a tuple of (key, value) bytes pairs
        const Params &prm = params();
        PyObj *items = py_.Tuple_New(static_cast<ssize_t>(prm.size()));
        if (items == nullptr) {
            py_.Err_Print();
            return false;
        }
        ssize_t i = 0;
        for (const auto &kv : prm) py_.Tuple_SetItem(items, i++, make_args(py_, {bytes_of(py_, kv.first), bytes_of(py_, kv.second)}));
        PyObj *args = make_args(py_, {bytes_of(py_, local_agent_), items});
        if (args == nullptr) {
            py_.Err_Print();
            return false;
        }
        PyObj *obj = py_.Object_CallObject(create.get(), args);
        py_.DecRef(args);
        if (obj == nullptr) {
            log_error("creating the MooncakeCore backend for agent '" + local_agent_ + "' failed:");
            py_.Err_Print();
            return false;
        }
        Adapter &a = rt_->adapter;
        a.obj = obj;
        struct {
            PyObj **slot;
            const char *name;
        } binds[] = {{&a.transfer, "transfer"}, {&a.notify, "notify"},       {&a.drain, "drain_notifs"},
                     {&a.reg, "register"},      {&a.dereg, "deregister"},    {&a.close, "close"}};
        for (auto &b : binds) {
            *b.slot = py_.Object_GetAttrString(obj, b.name);
            if (*b.slot == nullptr) {
                log_error(std::string("the Python adapter has no method ") + b.name);
                py_.Err_Print();
                return false;
            }
        }
        PyRef seg(py_, py_.Object_GetAttrString(obj, "conn_segment"));
        char *sb = nullptr;
        ssize_t sl = 0;
        if (!seg || py_.Bytes_AsStringAndSize(seg.get(), &sb, &sl) != 0 || sl == 0) {
            log_error("the Python adapter has no conn_segment (bytes)");
            py_.Err_Print();
            return false;
        }
        segment_.assign(sb, static_cast<size_t>(sl));
        PyRef nw(py_, py_.Object_GetAttrString(obj, "num_workers"));
        workers = nw ? py_.Long_AsLongLong(nw.get()) : -1;
        if (workers < 1 || workers > 64) {
            py_.Err_Clear();
            log_error("the Python adapter's num_workers is not in 1..64");
            return false;
        }
        return true;
    }

    const PyApi &py_;
    std::shared_ptr<Runtime> rt_;
    std::vector<std::thread> workers_;
    std::string segment_;
    mutable std::mutex peers_mu_;
    std::unordered_map<std::string, std::string> peers_;  // agent -> TE segment
};

// ------------------------------------------------------------------ plugin entry points
EngineBase *create_engine(const InitParams *p) {
    try {
        return new MooncakeCoreEngine(p);
    } catch (const std::exception &e) {
        log_error(std::string("backend creation failed: ") + e.what());
        return nullptr;
    } catch (...) {
        log_error("backend creation failed");
        return nullptr;
    }
}

void destroy_engine(EngineBase *e) { delete e; }
const char *plugin_name() { return kBackendName; }
const char *plugin_version() { return MOONCAKE_NIXL_VERSION; }

Params backend_options() {
    // Defaults of the parameters the adapter understands (docs/nixl.md).
    return {{"local_hostname", ""}, {"metadata_server", "P2PHANDSHAKE"}, {"num_workers", "2"},
            {"protocol", "tcp"},          {"device_name", ""}};
}

Plugin g_plugin = {kPluginApiVersion, create_engine, destroy_engine, plugin_name,
                   plugin_version,    backend_options, backend_mems};

}  // namespace
}  // namespace mcnixl

extern "C" MC_EXPORT mcnixl::Plugin *nixl_plugin_init() { return &mcnixl::g_plugin; }
extern "C" MC_EXPORT void nixl_plugin_fini() {}
