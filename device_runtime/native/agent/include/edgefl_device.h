/* edgefl_device.h: the native device agent as a library. The binary `edgefl-device` is a thin main over it;
 * an Android (JNI) or iOS app links the same code and drives it through these five calls.
 *
 *   edgefl_device_config c; edgefl_device_config_init(&c); c.id = "phone-0"; ...
 *   edgefl_device* d; char why[512];
 *   if (edgefl_device_start(&c, &d, why, sizeof why) != 0) { show(why); }   connects, announces presence
 *   edgefl_device_run(d);        trains what the coordinator sends until stopped or c.rounds are done
 *   edgefl_device_stop(d);       from any thread: ends a fetch, kills a training child, run() returns soon
 *   edgefl_device_close(d);      says offline ("it stopped"), disconnects, frees
 *
 * The protocol it speaks is docs/device-protocol.md; it is the Python agent's (device_runtime/) in C++. */
#ifndef EDGEFL_DEVICE_H
#define EDGEFL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { EDGEFL_LOG_INFO = 0, EDGEFL_LOG_WARNING = 1, EDGEFL_LOG_ERROR = 2 };

typedef void (*edgefl_device_log_fn)(void* user, int level, const char* line);

typedef struct edgefl_device_config {
  const char* id;            /* device id: its MQTT client id and login name */
  const char* broker;        /* mqtt://HOST:PORT or mqtts://HOST:PORT */
  const char* credentials;   /* JSON login file {"username", "password"}; NULL: anonymous */
  const char* ca_file;       /* the broker's CA certificate (mqtts); NULL: the system's */
  const char* data;          /* folder with x.npy and y.npy (or an .npz), handed to the trainer */
  const char* runtime;       /* "executorch": the only runtime a native device trains */
  const char* trainer;       /* path of edgefl-et-train */
  const char* cache_dir;     /* sha256-addressed artifact cache */
  const char* profile;       /* hardware profile name, announced only (may be NULL) */
  const char* energy;        /* auto | rapl | battery | ina219 | profile */
  int64_t memory_bytes;      /* peak training memory granted; 0: not declared */
  int64_t cache_budget_bytes;/* what the cache keeps beyond the current set; 0: 128 MiB */
  double power_w;            /* active power for the profile energy estimate; 0: none */
  double receipt_wait_s;     /* wait for a receipt before an upload is sent again (doubling); 0: 30 */
  double fetch_timeout_s;    /* a file's fetch deadline; 0: 600 */
  int threads;               /* training threads; 0: 1 */
  int enforce_memory;        /* kill a training child that goes over memory_bytes */
  int rounds;                /* stop after this many rounds; 0: until stopped */
  int i2c_bus;               /* INA219 bus; -1: none */
  edgefl_device_log_fn log;  /* every log line and status change; NULL: stdout */
  void* user;
} edgefl_device_config;

typedef struct edgefl_device edgefl_device;

/* Defaults for every field (rounds 0, threads 1, ...). */
void edgefl_device_config_init(edgefl_device_config* config);

/* Connects, checks the login and announces the device. 0, or 2 with a one-line reason naming the thing and
 * the fix in `why` (a user's mistake: wrong password, unreachable broker, missing file). */
int edgefl_device_start(const edgefl_device_config* config, edgefl_device** device, char* why, size_t why_size);

/* Serves instructions until stopped or the configured rounds are done; the rounds reported. */
int edgefl_device_run(edgefl_device* device);

/* Safe from any thread (not from a signal handler: call it from a thread that waited for the signal). */
void edgefl_device_stop(edgefl_device* device);

void edgefl_device_close(edgefl_device* device);

#ifdef __cplusplus
}
#endif
#endif
