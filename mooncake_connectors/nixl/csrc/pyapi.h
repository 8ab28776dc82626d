// The few CPython C-API functions the plugin calls, resolved at run time with dlsym.
//
// Why not Python.h: the plugin then needs no python3-dev package, is not tied to one Python
// version (only functions of the stable ABI are used, never a struct field or macro), and
// still loads in a process without Python -- where creating the backend fails with a clear
// message instead of dlopen failing on an unresolved symbol.
#pragma once

#include <dlfcn.h>
#include <sys/types.h>

#include <string>
#include <type_traits>

namespace mcnixl {

using PyObj = void;  // opaque: never dereferenced here

struct PyApi {
    int (*IsInitialized)() = nullptr;
    int (*IsFinalizing)() = nullptr;  // Py_IsFinalizing (3.13+) or _Py_IsFinalizing (3.7-3.12)
    int (*GILState_Ensure)() = nullptr;
    void (*GILState_Release)(int) = nullptr;
    int (*GILState_Check)() = nullptr;
    void *(*Eval_SaveThread)() = nullptr;
    void (*Eval_RestoreThread)(void *) = nullptr;
    PyObj *(*Import_ImportModule)(const char *) = nullptr;
    PyObj *(*Object_GetAttrString)(PyObj *, const char *) = nullptr;
    PyObj *(*Object_CallObject)(PyObj *, PyObj *) = nullptr;
    int (*Object_IsTrue)(PyObj *) = nullptr;
    PyObj *(*Tuple_New)(ssize_t) = nullptr;
    int (*Tuple_SetItem)(PyObj *, ssize_t, PyObj *) = nullptr;  // steals the item
    PyObj *(*Sequence_GetItem)(PyObj *, ssize_t) = nullptr;     // new reference
    ssize_t (*Sequence_Size)(PyObj *) = nullptr;
    PyObj *(*Bytes_FromStringAndSize)(const char *, ssize_t) = nullptr;
    int (*Bytes_AsStringAndSize)(PyObj *, char **, ssize_t *) = nullptr;
    PyObj *(*Long_FromLongLong)(long long) = nullptr;
    PyObj *(*Long_FromUnsignedLongLong)(unsigned long long) = nullptr;
    long long (*Long_AsLongLong)(PyObj *) = nullptr;
    PyObj *(*MemoryView_FromMemory)(char *, ssize_t, int) = nullptr;
    PyObj *(*Err_Occurred)() = nullptr;
    void (*Err_Print)() = nullptr;
    void (*Err_Clear)() = nullptr;
    void (*IncRef)(PyObj *) = nullptr;
    void (*DecRef)(PyObj *) = nullptr;
    PyObj *None = nullptr;
    static constexpr int kBufRead = 0x100;  // PyBUF_READ

    // Resolve everything; false (and `missing` names the first absent symbol) when this
    // process has no usable Python interpreter.
    bool load(std::string &missing) {
        auto get = [&](auto &fn, const char *name) {
            void *p = dlsym(RTLD_DEFAULT, name);
            if (p == nullptr && missing.empty()) missing = name;
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        };
        get(IsInitialized, "Py_IsInitialized");
        void *fin = dlsym(RTLD_DEFAULT, "Py_IsFinalizing");
        if (fin == nullptr) fin = dlsym(RTLD_DEFAULT, "_Py_IsFinalizing");
        IsFinalizing = reinterpret_cast<int (*)()>(fin);
        if (fin == nullptr && missing.empty()) missing = "Py_IsFinalizing";
        get(GILState_Ensure, "PyGILState_Ensure");
        get(GILState_Release, "PyGILState_Release");
        get(GILState_Check, "PyGILState_Check");
        get(Eval_SaveThread, "PyEval_SaveThread");
        get(Eval_RestoreThread, "PyEval_RestoreThread");
        get(Import_ImportModule, "PyImport_ImportModule");
        get(Object_GetAttrString, "PyObject_GetAttrString");
        get(Object_CallObject, "PyObject_CallObject");
        get(Object_IsTrue, "PyObject_IsTrue");
        get(Tuple_New, "PyTuple_New");
        get(Tuple_SetItem, "PyTuple_SetItem");
        get(Sequence_GetItem, "PySequence_GetItem");
        get(Sequence_Size, "PySequence_Size");
        get(Bytes_FromStringAndSize, "PyBytes_FromStringAndSize");
        get(Bytes_AsStringAndSize, "PyBytes_AsStringAndSize");
        get(Long_FromLongLong, "PyLong_FromLongLong");
        get(Long_FromUnsignedLongLong, "PyLong_FromUnsignedLongLong");
        get(Long_AsLongLong, "PyLong_AsLongLong");
        get(MemoryView_FromMemory, "PyMemoryView_FromMemory");
        get(Err_Occurred, "PyErr_Occurred");
        get(Err_Print, "PyErr_Print");
        get(Err_Clear, "PyErr_Clear");
        get(IncRef, "Py_IncRef");
        get(DecRef, "Py_DecRef");
        None = dlsym(RTLD_DEFAULT, "_Py_NoneStruct");
        if (None == nullptr && missing.empty()) missing = "_Py_NoneStruct";
        return missing.empty() && IsInitialized() != 0;
    }

    bool alive() const { return IsInitialized() != 0 && IsFinalizing() == 0; }
};

// Holds the GIL for its scope (re-entrant: fine on a thread that already holds it).
class GilHold {
  public:
    explicit GilHold(const PyApi &py) : py_(py), state_(py.GILState_Ensure()) {}
    ~GilHold() { py_.GILState_Release(state_); }
    GilHold(const GilHold &) = delete;
    GilHold &operator=(const GilHold &) = delete;

  private:
    const PyApi &py_;
    int state_;
};

// Drops the GIL for its scope if this thread holds it (for blocking waits on our workers,
// which need the GIL to finish).
class GilDrop {
  public:
    explicit GilDrop(const PyApi &py) : py_(py) {
        if (py_.alive() && py_.GILState_Check()) saved_ = py_.Eval_SaveThread();
    }
    ~GilDrop() {
        if (saved_ != nullptr) py_.Eval_RestoreThread(saved_);
    }
    GilDrop(const GilDrop &) = delete;
    GilDrop &operator=(const GilDrop &) = delete;

  private:
    const PyApi &py_;
    void *saved_ = nullptr;
};

// An owned reference (DecRef on scope exit; the GIL must be held then).
class PyRef {
  public:
    PyRef(const PyApi &py, PyObj *o) : py_(py), o_(o) {}
    ~PyRef() {
        if (o_ != nullptr) py_.DecRef(o_);
    }
    PyRef(const PyRef &) = delete;
    PyRef &operator=(const PyRef &) = delete;
    PyObj *get() const { return o_; }
    PyObj *release() {
        PyObj *o = o_;
        o_ = nullptr;
        return o;
    }
    explicit operator bool() const { return o_ != nullptr; }

  private:
    const PyApi &py_;
    PyObj *o_;
};

}  // namespace mcnixl
