"""The page's model panels: the loading line, the model picker and switching, the training of PPD tokens, the device and
calibration panels, and the sampling widgets' defaults.

Each event returns ``{component: update}`` (components of ``Page``); what it leaves out stays as it is.
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from app.calibration_progress import followed
from app.model_catalog import choices
from app.model_host import ModelHost
from app.page_layout import RESUME_TRAINING, STOP_TRAINING, TRAIN, Page, Session, send_button
from app.page_text import (calibration_summary, chosen_label, model_note, one_line, sampling_defaults, switch_panels,
                           switched_line, training_choice, training_offer)
from app.plots import latency_points
from app.system_info import device_panel
from ppd_core.training.cost import TrainingCost, answered_step, calibrated_step, model_shape, training_cost
from ppd_core.errors import PpdError


class ModelHandlers:
    """The events about the loaded model, and the page's timer following it."""

    def __init__(self, host: ModelHost, page: Page):
        self.host = host
        self.page = page
        self._shown_model = None  # the engine whose sampling and name the pages were last given

    def model_panels(self, fresh_page: bool = False) -> dict:
        """What depends on the model (``Page.model_panels``). While it loads: its progress, Send off, and the timer on so
        the page keeps asking; once ready, the model's sampling defaults (its recommendation, else ppd's and
        llama-server's, each widget naming its source) and the models to switch to: set on a fresh page and once per
        newly loaded model, never over the user's choices on the timer's later ticks (while a training runs, say)."""
        host, page = self.host, self.page
        if not host.ready:  # loading; or no model could load: the line says so and the picker opens
            failed = host.startup.error is not None and not host.switching
            return {page.startup: f"**{host.startup.line()}**", page.chat.send: send_button(False, failed),
                    page.device: "No model is loaded." if failed else "The model is loading.",
                    page.timer: gr.Timer(active=not failed), page.model.choice: gr.update(interactive=failed),
                    page.model.train: gr.update(interactive=False), page.model_note: ""}
        engine, model = host.engine, host.snapshot()
        training, training_runs = self.training_panel()
        new_model, self._shown_model = self._shown_model is not engine, engine
        panels = {page.startup: host.switch_note or (f"*{host.background}*" if host.background else ""),
                  page.chat.send: send_button(True), page.device: device_panel(model),
                  page.calibration.summary: calibration_summary(model.profile, model.tree["name"]),
                  page.calibration.curve: latency_points(model.profile) if model.profile else None,
                  page.timer: gr.Timer(active=host.switching or training_runs or host.background is not None),
                  page.model.choice: gr.update(interactive=True), **training,
                  page.model_note: model_note(model, host.spec)}
        if fresh_page or new_model:
            widgets = page.settings.by_name
            panels.update({widgets[name]: update for name, update in sampling_defaults(model.sampling_defaults).items()})
            panels[page.model.choice] = gr.update(choices=choices(host.spec), value=host.spec, interactive=True)
        return panels

    def training_panel(self) -> tuple[dict, bool]:
        """The status line and the train button, and whether a training runs: the offer to train
        PPD tokens for a model that has none, a running training's progress, a stopped one's resume; a finished one
        loads its tokens (recalibrating)."""
        host, model = self.host, self.page.model
        job, has_tokens = host.training(), host.snapshot().prompt_tokens.count > 0
        status = job.status()

        def panel(line: str, button: dict, running: bool) -> tuple[dict, bool]:
            return {model.training: line, model.train: button}, running

        # trained while this app ran (its own trainer or an adopted one): load the new tokens (the engine finds them) and
        # calibrate them, once for every page
        if status.state == "done" and job.ran and host.apply_training(job):
            return panel("Training finished: loading the new PPD tokens…", gr.update(visible=False), True)
        if status.state == "running":  # this app's trainer, or one adopted from an earlier app: either can be stopped
            return panel(status.line, training_button(STOP_TRAINING, variant="stop"), True)
        if status.state == "stopping":  # Resume once the trainer is gone
            return panel(status.line, gr.update(visible=True, value=STOP_TRAINING, variant="stop", interactive=False),
                         True)
        if status.state in ("stopped", "failed"):
            return panel(status.line, training_button(RESUME_TRAINING), False)
        if has_tokens:
            return panel("", gr.update(visible=False), False)
        # two lines at most beside the button
        return panel("No PPD tokens yet: guesses come from the conversation alone.", training_button(TRAIN), False)

    def page_panels(self, session: Session, panels: dict) -> dict:
        """``model_panels``' updates for one page: its Send stays off while its own answer streams, and the sampling
        values its user set stay as set when another model's defaults come."""
        panels = {**panels, **self.switch_line(session)}
        if session.answering:
            panels[self.page.chat.send] = gr.update(interactive=False)
        for name, widget in self.page.settings.by_name.items():
            if name in session.chosen and widget in panels and panels[widget].get("value") is not None:
                panels[widget] = gr.update(label=chosen_label(name))
        return panels

    def switch_line(self, session: Session) -> dict:
        """The line over the chat once another model than the one that answered this page's conversation is loaded
        (a switch never carries a conversation over silently), with its New chat for this model button."""
        host = self.host
        line = switched_line(session.conversation, host.engine.loaded.name) if host.ready else ""
        return switch_panels(self.page.chat, line)

    def choose(self, name: str, session: Session) -> dict:
        """The user set sampling widget ``name``: its label says so, and a model loaded later leaves it as set."""
        session.chosen.add(name)
        return {self.page.session: session, self.page.settings.by_name[name]: gr.update(label=chosen_label(name))}

    def training_button(self, label: str | None) -> dict:
        """The training button clicked: ``label`` is what it said (Stop while a training ran), so a click never
        does what the page did not show: Train offers the runs with their cost (nothing starts before one is chosen),
        Resume goes on with the run chosen, Stop stops it. The page's timer is left on: clicks are answered
        concurrently (a Stop waits for its trainer to end), so an answer can arrive after a later one, and the next
        tick puts the page right."""
        if label == TRAIN:
            return self.offer_training()
        panels = self.stop_training() if label == STOP_TRAINING else self.train()
        return {**panels, self.page.timer: gr.Timer(active=True)}

    def offer_training(self) -> dict:
        """The training's size, its time at this device's measured speed, its memory and disk, and a quick run beside
        the full one; nothing starts until one is chosen."""
        offer = self.page.model.offer
        if not self.host.ready:
            return {offer.box: gr.update(visible=False)}
        name = self.host.engine.loaded.name
        try:
            quick, full = training_costs(self.host)
        except (PpdError, OSError, ValueError) as error:  # the runs are still offered, by their size alone
            sizes = self.host.training().choices()
            return {offer.box: gr.update(visible=True), offer.quick: gr.update(value=f"Quick: {sizes[0]:,}"),
                    offer.cost: f"**Train PPD tokens for {name}?** Its cost could not be estimated ({one_line(error)}).",
                    offer.full: gr.update(value=f"Full: {sizes[1]:,}")}
        return {offer.box: gr.update(visible=True), offer.cost: training_offer(name, quick, full),
                offer.quick: gr.update(value=training_choice("Quick", quick)),
                offer.full: gr.update(value=training_choice("Full", full))}

    def start_training(self, run: str) -> dict:
        """A run chosen in the offer (``run``: "quick" or "full"): it starts, and the offer closes."""
        panels = {self.page.model.offer.box: gr.update(visible=False), self.page.timer: gr.Timer(active=True)}
        if not self.host.ready:
            return panels
        quick, full = self.host.training().choices()
        return {**self.train(quick if run == "quick" else full), **panels}

    def train(self, samples: int | None = None) -> dict:
        """Start (or resume) training PPD tokens for the loaded model in a background process, on ``samples``
        conversations (None: a resume's)."""
        try:
            self.host.training().start(samples)
        except (PpdError, OSError) as error:
            gr.Warning(one_line(error))
        return self.model_panels()

    def stop_training(self) -> dict:
        """Stop the model's training where it is (resumable; an adopted trainer too); the panel then offers Resume."""
        if self.host.ready:
            self.host.training().stop()
        return self.model_panels()

    def switch_model(self, spec: str) -> dict:
        """Load another model in the background; the page follows its progress (the timer) until it is ready."""
        spec = (spec or "").strip()
        host = self.host
        if not spec or (spec == host.spec and host.ready):
            return self.model_panels()
        try:
            host.queue.check_room()
            host.start_switch(spec)  # one at a time: another model asked for meanwhile is one line
        except PpdError as error:
            gr.Warning(str(error))
        return self.model_panels()

    def device(self):
        """The device panel (after an answer: its figures change); kept while no model is ready."""
        return device_panel(self.host.snapshot()) if self.host.ready else gr.update()

    def calibrate(self) -> Iterator[dict]:
        """Calibrate for this device. The summary's place says what runs, with numbers, from the click on
        (``followed``), then shows the new summary, with the latency plot and the device panel."""
        summary = self.page.calibration.summary
        lines = followed(self.host.calibrate)
        try:
            while True:
                yield {summary: next(lines)}
        except StopIteration as end:
            profile = end.value
        except PpdError as error:  # ppd busy
            gr.Warning(str(error))
            yield {summary: str(error)}
            return
        yield {self.page.calibration.curve: latency_points(profile), summary: calibration_summary(profile),
               self.page.device: device_panel(self.host.snapshot())}


def training_costs(host: ModelHost) -> tuple[TrainingCost, TrainingCost]:
    """The quick and the full run's costs for the loaded model, timed by this device's measurement of it: its
    calibration, else its last answer (none: no time)."""
    engine, job = host.engine, host.training()
    shape = model_shape(engine.loaded)
    last = host.last_answer[1] if host.last_answer and host.last_answer[0] is engine else None

    def cost(samples: int) -> TrainingCost:
        size = job.size(samples)
        return training_cost(size, shape, calibrated_step(host.snapshot().profile, size) or answered_step(last))

    quick, full = job.choices()
    return cost(quick), cost(full)


def training_button(label: str, variant: str = "secondary") -> dict:
    """The training button's update: shown, clickable, saying ``label``."""
    return gr.update(visible=True, value=label, variant=variant, interactive=True)
