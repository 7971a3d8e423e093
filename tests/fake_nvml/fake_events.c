/*
 * Event sets and injected XID events for the fake NVML; #included at the end of
 * fake_nvml.c, so it shares its state (g, g_mu, enter/leave, DEV_ENTER, maybe_reload).
 *
 * Scenario keys (tests/fakenvml.py, briefs/keys.md "XID events"):
 *   xid_events=<uuid>:<code>,...   global, cumulative: each entry is delivered once, in order,
 *                                  when the fake first sees it, to every live set in which the
 *                                  device that has that UUID now is registered for 0x8
 *   gpu.<i>.xid_supported=0|1      default 1; 0: registration NOT_SUPPORTED, supported mask 0
 *
 * A set is a slot in a static array, so a stale pointer (freed, or reclaimed by the last
 * nvmlShutdown) is still safe to look at: calls on it answer INVALID_ARGUMENT (UNINITIALIZED
 * while NVML is shut down). Slots are reused round-robin so a stale pointer rarely aliases
 * a new set.
 */

#include <poll.h>
#include <stdint.h>

#ifndef FAKE_WITH_NVML_H
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL
#endif

_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t size");

/* Own names: with nvml.h these are enum members, not macros. */
#define EV_RC_TIMEOUT 10
#define EV_RC_MEMORY 20
#define EV_XID ((unsigned long long)nvmlEventTypeXidCriticalError)
#define EV_NO_INSTANCE 0xFFFFFFFFu
#define EV_MAX_SETS 32
#define EV_QUEUE 256          /* per set; a full queue drops the newest event */
#define EV_MAX_INJECTED 512
#define EV_SLICE_MS 10        /* a wait re-reads the scenario this often (default) */

typedef struct {
    int idx;
    unsigned long long type, data;
    unsigned int gi, ci;
} fake_event_t;

struct nvmlEventSet_st {
    int live;
    unsigned long long mask[MAX_GPUS]; /* registered event bits per device index */
    fake_event_t q[EV_QUEUE];
    int head, len;
};

typedef struct {
    char uuid[96];
    unsigned long long code;
} fake_xid_t;

static struct nvmlEventSet_st g_sets[EV_MAX_SETS];
static int g_set_next;                       /* round-robin slot cursor */
static pthread_cond_t g_ev_cond = PTHREAD_COND_INITIALIZER; /* with g_mu: an event or a free */

/* Per reload (events_defaults resets, the parser fills). */
static int g_xid_unsupported[MAX_GPUS];
static fake_xid_t g_xid_list[EV_MAX_INJECTED];
static int g_xid_n;
/* Across reloads: what was already delivered, so each entry comes once. */
static fake_xid_t g_xid_done[EV_MAX_INJECTED];
static int g_xid_done_n;
static char g_xid_path[4096];

static int events_gpu_key(int idx, const char *k, const char *v) {
    if (strcmp(k, "xid_supported") != 0) return 0;
    g_xid_unsupported[idx] = num(v) == 0;
    return 1;
}

/* "uuid:code,uuid:code" (the code after the last ':', decimal or 0x) */
static int events_key(const char *k, const char *v) {
    if (strcmp(k, "xid_events") != 0) return 0;
    g_xid_n = 0;
    const char *p = v;
    while (*p && g_xid_n < EV_MAX_INJECTED) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        const char *end = p + strcspn(p, ",");
        const char *colon = NULL;
        for (const char *c = p; c < end; c++)
            if (*c == ':') colon = c;
        if (colon && colon > p) {
            fake_xid_t *e = &g_xid_list[g_xid_n++];
            int n = (int)(colon - p) < (int)sizeof e->uuid - 1 ? (int)(colon - p) : (int)sizeof e->uuid - 1;
            memcpy(e->uuid, p, (size_t)n);
            e->uuid[n] = '\0';
            e->code = strtoull(colon + 1, NULL, 0);
        } else if (end > p)
            fprintf(stderr, "fake-nvml: ignoring xid_events entry without ':'\n");
        p = end;
    }
    return 1;
}

static void events_defaults(void) {
    memset(g_xid_unsupported, 0, sizeof g_xid_unsupported);
    g_xid_n = 0;
}

/* A pointer this fake handed out (live or stale), and live. */
static int ev_live_set(nvmlEventSet_t set) {
    uintptr_t at = (uintptr_t)set, base = (uintptr_t)g_sets;
    if (at < base || at - base >= sizeof g_sets || (at - base) % sizeof g_sets[0]) return 0;
    return set->live;
}

static void ev_queue(struct nvmlEventSet_st *s, fake_event_t ev) {
    if (s->len >= EV_QUEUE) return;
    s->q[(s->head + s->len) % EV_QUEUE] = ev;
    s->len++;
}

static void ev_deliver(const fake_xid_t *x) {
    int idx = -1;
    for (int i = 0; i < g.count; i++)
        if (strcasecmp(g.gpus[i].uuid, x->uuid) == 0) {
            idx = i;
            break;
        }
    if (idx < 0) return; /* no such GPU now: lost, as on hardware */
    fake_event_t ev = {idx, EV_XID, x->code, EV_NO_INSTANCE, EV_NO_INSTANCE};
    for (int s = 0; s < EV_MAX_SETS; s++)
        if (g_sets[s].live && (g_sets[s].mask[idx] & EV_XID)) ev_queue(&g_sets[s], ev);
}

/* The list is cumulative: entries past the part already delivered are new. A list that no
 * longer starts with what was delivered (another test's machine, a rewritten list) counts
 * from where it differs. */
static void events_after_reload(void) {
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path) path = "";
    if (strcmp(path, g_xid_path) != 0) { /* another scenario file: another machine */
        copy(g_xid_path, sizeof g_xid_path, path);
        g_xid_done_n = 0;
    }
    int same = 0;
    while (same < g_xid_n && same < g_xid_done_n && g_xid_list[same].code == g_xid_done[same].code &&
           strcmp(g_xid_list[same].uuid, g_xid_done[same].uuid) == 0)
        same++;
    int delivered = 0;
    for (int i = same; i < g_xid_n; i++) {
        ev_deliver(&g_xid_list[i]);
        delivered = 1;
    }
    memcpy(g_xid_done, g_xid_list, sizeof(fake_xid_t) * (size_t)g_xid_n);
    g_xid_done_n = g_xid_n;
    if (delivered) pthread_cond_broadcast(&g_ev_cond);
}

static void events_on_shutdown(void) {
    for (int s = 0; s < EV_MAX_SETS; s++) g_sets[s].live = 0;
    pthread_cond_broadcast(&g_ev_cond);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t rc = enter(FN_nvmlEventSetCreate, -1, 1);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!set) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int n = 0; n < EV_MAX_SETS; n++) {
        int s = (g_set_next + n) % EV_MAX_SETS;
        if (g_sets[s].live) continue;
        memset(&g_sets[s], 0, sizeof g_sets[s]);
        g_sets[s].live = 1;
        g_set_next = (s + 1) % EV_MAX_SETS;
        *set = &g_sets[s];
        return leave(NVML_SUCCESS);
    }
    return leave(EV_RC_MEMORY);
}

static unsigned long long ev_supported(int idx) { return g_xid_unsupported[idx] ? 0 : EV_XID; }

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    DEV_ENTER(nvmlDeviceGetSupportedEventTypes);
    if (!eventTypes) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = ev_supported(idx_);
    return leave(NVML_SUCCESS);
}

/* Any bit the device does not support: NOT_SUPPORTED and nothing registered (header). */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    DEV_ENTER(nvmlDeviceRegisterEvents);
    if (!ev_live_set(set)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~ev_supported(idx_)) return leave(NVML_ERROR_NOT_SUPPORTED);
    set->mask[idx_] |= eventTypes;
    return leave(NVML_SUCCESS);
}

static long long ev_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The scenario is only re-read inside NVML calls, so a blocked wait wakes every EV_SLICE_MS
 * to re-read it itself (injected events, a new rc override), with g_mu released while it
 * sleeps so other threads' calls go on. */
static nvmlReturn_t ev_wait(int fn, nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    nvmlReturn_t rc = enter(fn, -1, 1);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!data || !ev_live_set(set)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    long long deadline = ev_now_ms() + timeoutms;
    /* $FAKE_NVML_EVENT_POLL_MS: a longer slice makes an idle wait block like a real driver's
     * (the benchmark counts wakeups); tests keep the short default for quick injection */
    static long long slice_ms = -1;
    if (slice_ms < 0) {
        const char *poll = getenv("FAKE_NVML_EVENT_POLL_MS");
        slice_ms = poll && atoll(poll) > 0 ? atoll(poll) : EV_SLICE_MS;
    }
    for (;;) {
        if (set->len > 0) {
            fake_event_t ev = set->q[set->head];
            set->head = (set->head + 1) % EV_QUEUE;
            set->len--;
            g_handles[ev.idx].index = ev.idx;
            data->device = &g_handles[ev.idx];
            data->eventType = ev.type;
            data->eventData = ev.data;
            data->gpuInstanceId = ev.gi;
            data->computeInstanceId = ev.ci;
            return leave(NVML_SUCCESS);
        }
        long long left = deadline - ev_now_ms();
        if (left <= 0) return leave(EV_RC_TIMEOUT);
        /* a sleep a signal ends, as a real driver's wait: nvml.h says it "can return before
         * specified timeout passes (e.g. when interrupt arrives)", with TIMEOUT (a signal whose
         * handler runs on this thread; the exporter's stop() sends one). A condition wait would
         * not return for it; events another thread's call delivers are seen at the slice's end */
        pthread_mutex_unlock(&g_mu);
        int slept = poll(NULL, 0, (int)(left < slice_ms ? left : slice_ms));
        int interrupted = slept < 0 && errno == EINTR;
        pthread_mutex_lock(&g_mu);
        if (interrupted) return leave(EV_RC_TIMEOUT);
        maybe_reload(); /* may queue injected events to this set */
        if (g_init_refs <= 0) return leave(NVML_ERROR_UNINITIALIZED);
        if (!set->live) return leave(NVML_ERROR_INVALID_ARGUMENT); /* freed meanwhile */
        rc = (nvmlReturn_t)override_rc(fn, -1); /* e.g. GPU_IS_LOST set while waiting */
        if (rc != NVML_SUCCESS) return leave(rc);
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return ev_wait(FN_nvmlEventSetWait_v2, set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return ev_wait(FN_nvmlEventSetWait, set, data, timeoutms);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t rc = enter(FN_nvmlEventSetFree, -1, 1);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!ev_live_set(set)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    set->live = 0;
    set->len = 0;
    pthread_cond_broadcast(&g_ev_cond);
    return leave(NVML_SUCCESS);
}
