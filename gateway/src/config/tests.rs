use super::*;

#[test]
fn minimal_config_gets_defaults_and_env_overrides() {
    let mut c: Config = toml::from_str("[models.base]\nworkers = [\"127.0.0.1:1\"]\n").unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080");
    assert!(c.store.redis_url.is_none());
    c.apply_env(|k| (k == "GATEWAY_REDIS_URL").then(|| "redis://127.0.0.1/".to_string()))
        .unwrap();
    assert_eq!(c.store.redis_url.as_deref(), Some("redis://127.0.0.1/"));
    assert!(c.check().is_ok());
    assert!(!c.store.redis_cluster);
    c.apply_env(|k| (k == "GATEWAY_REDIS_CLUSTER").then(|| "true".to_string()))
        .unwrap();
    assert!(c.store.redis_cluster);
    assert!(c
        .apply_env(|k| (k == "GATEWAY_REDIS_CLUSTER").then(|| "maybe".to_string()))
        .is_err());
    let e =
        toml::from_str::<Config>("[store]\nredis_cluster = true\n[models.base]\nworkers = []\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
    assert!(e.contains("needs store.redis_url"), "{e}");
    c.admin_listen = c.listen.clone();
    let e = c.check().unwrap_err().to_string();
    assert!(e.contains("must differ"), "{e}");
}

#[test]
fn telemetry_defaults_file_and_env() {
    let mut c: Config = toml::from_str("[models.base]\nworkers = []\n").unwrap();
    assert_eq!(c.telemetry.otlp_endpoint, None);
    assert_eq!(c.telemetry.service_name, "gateway");
    let mut c2: Config = toml::from_str(
        "[telemetry]\notlp_endpoint = \"http://collector:4317\"\n[models.base]\nworkers = []\n",
    )
    .unwrap();
    assert_eq!(
        c2.telemetry.otlp_endpoint.as_deref(),
        Some("http://collector:4317")
    );
    assert!(c2.check().is_ok());
    // The env var overrides the file; empty turns export off.
    c2.apply_env(|k| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(String::new))
        .unwrap();
    assert_eq!(c2.telemetry.otlp_endpoint, None);
    c.apply_env(|k| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://10.0.0.1:4317".into()),
        "OTEL_SERVICE_NAME" => Some("gw-eu".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        c.telemetry.otlp_endpoint.as_deref(),
        Some("http://10.0.0.1:4317")
    );
    assert_eq!(c.telemetry.service_name, "gw-eu");
    c.telemetry.otlp_endpoint = Some("collector:4317".into());
    assert!(c.check().is_err());
}

#[test]
fn planner_agents_are_checked() {
    let base = "[models.base]\nworkers = []\n";
    let ok: Config = toml::from_str(&format!(
        "[planner]\nrun_timeout_ms = 5000\n[[planner.agents]]\nid = \"weather\"\nurl = \"https://w.example\"\n{base}"
    ))
    .unwrap();
    assert!(ok.check().is_ok());
    assert_eq!(ok.planner.run_timeout_ms, 5000);
    assert_eq!(ok.planner.hedge_after_ms, 15_000, "defaults fill the rest");
    for bad in [
        "id = \"has space\"\nurl = \"https://w\"",
        "id = \"w\"\nurl = \"ftp://w\"",
        "id = \"w\"\nurl = \"https://w\"\nauth_header = \"authorization\"",
    ] {
        let c: Config = toml::from_str(&format!("[[planner.agents]]\n{bad}\n{base}")).unwrap();
        assert!(c.check().is_err(), "{bad}");
    }
    assert!(toml::from_str::<Config>(&format!("[planner]\nbogus = 1\n{base}")).is_err());
    let allowed: Config = toml::from_str(&format!(
        "[planner]\nallowed_networks = [\"10.0.0.0/8\", \"*.svc.cluster.local\"]\n{base}"
    ))
    .unwrap();
    assert!(allowed.check().is_ok());
}

#[test]
fn added_models_need_a_window_and_prices_and_a_good_name() {
    let c: Config = toml::from_str(
        "[models.llama-70b]\nworkers = []\ncontext_window = 8192\ninput_price = 0.6\noutput_price = 0.8\nimage_input = true\ndescription = \"Llama 3.3 70B\"\n[models.base]\nworkers = []\n",
    )
    .unwrap();
    c.check().unwrap();
    let added = c.added_models().unwrap();
    assert_eq!(added.len(), 1);
    let l = &added[0];
    assert_eq!((l.id.as_str(), l.context_window), ("llama-70b", 8192));
    assert!((l.price.cached_input - 0.06).abs() < 1e-12, "10 % of input");
    assert!(l.image_input && !l.reasoning_budget);
    let catalog = c.catalog().unwrap();
    assert_eq!(catalog.models().len(), 4);
    assert_eq!(
        catalog.find("llama-70b").unwrap().description,
        "Llama 3.3 70B"
    );
    let refused = |toml: &str| {
        toml::from_str::<Config>(toml)
            .unwrap()
            .check()
            .unwrap_err()
            .to_string()
    };
    let e = refused("[models.llama-70b]\nworkers = []\ninput_price = 1.0\noutput_price = 1.0\n");
    assert!(
        e.contains("models.llama-70b: context_window is required"),
        "{e}"
    );
    let e = refused("[models.llama-70b]\nworkers = []\ncontext_window = 8192\ninput_price = 1.0\n");
    assert!(e.contains("output_price"), "{e}");
    let e = refused(
        "[models.x]\nworkers = []\ncontext_window = 8\ninput_price = -1.0\noutput_price = 1.0\n",
    );
    assert!(
        e.contains("input_price must be a number of at least 0"),
        "{e}"
    );
    let e = refused("[models.Llama]\nworkers = []\ncontext_window = 8192\ninput_price = 1.0\noutput_price = 1.0\n");
    assert!(e.contains("'Llama'") && e.contains("a-z 0-9"), "{e}");
    let e = refused("[models.base]\nworkers = []\ncontext_window = 8192\n");
    assert!(e.contains("are the spec's for base"), "{e}");
    let e = refused(&format!(
        "[[keys]]\nsha256 = \"{}\"\nmodels = [\"llama-8b\"]\n[models.base]\nworkers = []\n",
        "0".repeat(64)
    ));
    assert!(e.contains("keys[].models names 'llama-8b'"), "{e}");
    let e = refused("[models.gpt]\nworkers = []\n");
    assert!(
        e.contains("does not offer") && e.contains("context_window"),
        "{e}"
    );
}

#[test]
fn tls_sections_parse_and_worker_client_files_go_together() {
    let base = "[models.base]\nworkers = []\n";
    let c: Config = toml::from_str(&format!(
        "[tls]\ncert_file = \"/s/tls.crt\"\nkey_file = \"/s/tls.key\"\n\
         [worker_tls]\nca_file = \"/w/ca.crt\"\ncert_file = \"/w/c.crt\"\n\
         key_file = \"/w/c.key\"\nserver_name = \"worker.ns.svc\"\n{base}"
    ))
    .unwrap();
    assert!(c.check().is_ok());
    assert_eq!(c.tls.unwrap().key_file, Path::new("/s/tls.key"));
    assert_eq!(
        c.worker_tls.unwrap().server_name.as_deref(),
        Some("worker.ns.svc")
    );
    let plain: Config = toml::from_str(base).unwrap();
    assert!(plain.tls.is_none() && plain.worker_tls.is_none());
    let half: Config = toml::from_str(&format!(
        "[worker_tls]\nca_file = \"/w/ca.crt\"\ncert_file = \"/w/c.crt\"\n{base}"
    ))
    .unwrap();
    let e = half.check().unwrap_err().to_string();
    assert!(e.contains("go together"), "{e}");
    assert!(toml::from_str::<Config>(&format!("[tls]\ncert_file = \"x\"\n{base}")).is_err());
    assert!(toml::from_str::<Config>(&format!(
        "[tls]\ncert_file = \"x\"\nkey_file = \"y\"\nca = 1\n{base}"
    ))
    .is_err());
}

#[test]
fn unknown_model_and_bad_hash_are_rejected() {
    let c: Config = toml::from_str("[models.gpt]\nworkers = []\n").unwrap();
    assert!(c.check().is_err());
    let c: Config =
        toml::from_str("[[keys]]\nsha256 = \"abc\"\n[models.base]\nworkers = []\n").unwrap();
    assert!(c.check().is_err());
}

#[test]
fn a_stall_timeout_shorter_than_a_batched_replys_flushes_is_refused() {
    let pool = |ms: u64| {
        toml::from_str::<Config>(&format!(
            "[models.base]\nworkers = [\"127.0.0.1:1\"]\nstall_timeout_ms = {ms}\n"
        ))
        .unwrap()
    };
    let e = pool(1000).check().unwrap_err().to_string();
    assert!(
        e.contains("models.base.stall_timeout_ms must be at least 2000"),
        "{e}"
    );
    assert!(pool(2000).check().is_ok());
}

#[test]
fn flex_is_preempted_by_default_and_priority_never() {
    let pool = |lines: &str| {
        toml::from_str::<Config>(&format!(
            "[models.base]\nworkers = [\"127.0.0.1:1\"]\n{lines}\n"
        ))
    };
    let c = pool("").unwrap();
    let base = &c.models["base"];
    assert_eq!(base.preempt_tiers, [PreemptibleTier::Flex]);
    assert_eq!(base.max_preemptions, 2);
    let c = pool("preempt_tiers = [\"default\", \"flex\"]\nmax_preemptions = 0").unwrap();
    assert_eq!(c.models["base"].max_preemptions, 0);
    let e = pool("preempt_tiers = [\"priority\"]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown variant `priority`"), "{e}");
}
