// UcxApi: the few UCP functions this transport calls, loaded with dlopen from libucp.so.0 at
// the first Start. The build needs UCX's headers only (for the types); no binary of this
// engine links libucp, so a host without UCX runs every other transport and answers "ucx"
// with the reason the library could not be loaded.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "mooncake/status.h"

namespace mooncake::ucx {

struct UcxApi {
  void (*get_version)(unsigned* major, unsigned* minor, unsigned* release);
  const char* (*status_string)(ucs_status_t status);
  ucs_status_t (*config_read)(const char* env_prefix, const char* filename, ucp_config_t** c);
  void (*config_release)(ucp_config_t* config);
  ucs_status_t (*config_modify)(ucp_config_t* config, const char* name, const char* value);
  ucs_status_t (*init_version)(unsigned api_major, unsigned api_minor, const ucp_params_t* p,
                               const ucp_config_t* config, ucp_context_h* context);
  void (*cleanup)(ucp_context_h context);
  ucs_status_t (*context_query)(ucp_context_h context, ucp_context_attr_t* attr);
  void (*context_print_info)(ucp_context_h context, FILE* stream);
  ucs_status_t (*worker_create)(ucp_context_h context, const ucp_worker_params_t* p,
                                ucp_worker_h* worker);
  void (*worker_destroy)(ucp_worker_h worker);
  ucs_status_t (*worker_query)(ucp_worker_h worker, ucp_worker_attr_t* attr);
  void (*worker_release_address)(ucp_worker_h worker, ucp_address_t* address);
  unsigned (*worker_progress)(ucp_worker_h worker);
  ucs_status_t (*worker_get_efd)(ucp_worker_h worker, int* fd);
  ucs_status_t (*worker_arm)(ucp_worker_h worker);
  ucs_status_t (*ep_create)(ucp_worker_h worker, const ucp_ep_params_t* p, ucp_ep_h* ep);
  ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h ep, const ucp_request_param_t* param);
  ucs_status_ptr_t (*ep_flush_nbx)(ucp_ep_h ep, const ucp_request_param_t* param);
  void (*ep_print_info)(ucp_ep_h ep, FILE* stream);
  ucs_status_t (*mem_map)(ucp_context_h context, const ucp_mem_map_params_t* p,
                          ucp_mem_h* memh);
  ucs_status_t (*mem_unmap)(ucp_context_h context, ucp_mem_h memh);
  ucs_status_t (*rkey_pack)(ucp_context_h context, ucp_mem_h memh, void** buffer, size_t* size);
  void (*rkey_buffer_release)(void* buffer);
  ucs_status_t (*ep_rkey_unpack)(ucp_ep_h ep, const void* buffer, ucp_rkey_h* rkey);
  void (*rkey_destroy)(ucp_rkey_h rkey);
  ucs_status_ptr_t (*put_nbx)(ucp_ep_h ep, const void* buffer, size_t count, uint64_t remote,
                              ucp_rkey_h rkey, const ucp_request_param_t* param);
  ucs_status_ptr_t (*get_nbx)(ucp_ep_h ep, void* buffer, size_t count, uint64_t remote,
                              ucp_rkey_h rkey, const ucp_request_param_t* param);
  ucs_status_t (*request_check_status)(void* request);
  void (*request_free)(void* request);

  // "UCX 1.13.1"
  std::string Version() const;
  // "<what>: <UCX's words for status>"
  Status Error(const std::string& what, ucs_status_t status) const;
};

// Loads libucp.so.0 once per process (later calls return the same answer), after applying
// the environment of ucx_env.h. The library named by MC_UCX_LIBRARY is loaded instead when set. Unavailable with dlerror's reason when
// the library or one of its symbols is missing.
Result<const UcxApi*> LoadUcxApi();

}  // namespace mooncake::ucx
